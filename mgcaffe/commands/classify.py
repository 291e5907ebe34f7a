"""`mgcaffe classify`: score images with a trained net (Caffe's python/classify.py).

    mgcaffe classify INPUT OUTPUT.npy --model_def deploy.prototxt --pretrained_model w.caffemodel
                     [--images_dim 256,256] [--mean_file mean.npy|mean.binaryproto]
                     [--raw_scale 255] [--input_scale S] [--channel_swap 2,1,0]
                     [--center_only] [--ext jpg] [--gpu]

INPUT is an image file, a folder (every *.EXT in it) or a .npy array of H x W x K images.
The scores (N x classes, the mean over ten crops unless --center_only) are saved to
OUTPUT.npy; the top classes of each image are logged.
"""

from __future__ import annotations

import glob
import logging
import os

import numpy as np

import mgcaffe

from ..errors import MgcaffeError
from ..formats.protoio import read_binaryproto
from ..io import load_image

NAME = "classify"
HELP = "score images with a trained net (Caffe's classify.py); save the scores as .npy"

log = logging.getLogger(__name__)


def add_arguments(parser) -> None:
    parser.add_argument("input_file", help="image, folder of images, or .npy of images")
    parser.add_argument("output_file", help="where the scores go (.npy)")
    parser.add_argument("--model_def", required=True, help="deploy prototxt")
    parser.add_argument("--pretrained_model", required=True, help="trained .caffemodel")
    parser.add_argument("--images_dim", default="256,256",
                        help="H,W the images are resized to before cropping (256,256)")
    parser.add_argument("--mean_file", default="",
                        help="mean image (.npy K x H x W or .binaryproto); none by default")
    parser.add_argument("--input_scale", type=float, default=None,
                        help="multiply the preprocessed input by this")
    parser.add_argument("--raw_scale", type=float, default=255.0,
                        help="multiply the [0, 1] images by this first (255)")
    parser.add_argument("--channel_swap", default="2,1,0",
                        help="channel order, RGB -> BGR by default ('' keeps RGB)")
    parser.add_argument("--center_only", action="store_true",
                        help="score the centre crop only, not the ten-crop mean")
    parser.add_argument("--ext", default="jpg", help="image extension for a folder (jpg)")
    parser.add_argument("--gpu", action="store_true", help="run on GPU 0")


def _ints(text: str, what: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise MgcaffeError(f"--{what}: expected comma-separated integers, got {text!r}") from None


def _load_mean(path: str):
    if not path:
        return None
    if not os.path.isfile(path):
        raise MgcaffeError(f"{path}: mean file not found")
    if path.endswith(".npy"):
        return np.load(path)

    mean = read_binaryproto(path)
    return mean.reshape(mean.shape[-3:])


def _load_inputs(path: str, ext: str):

    if path.endswith(".npy"):
        return list(np.load(path))
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, f"*.{ext}")))
        if not files:
            raise MgcaffeError(f"{path}: no *.{ext} images in this folder")
        return [load_image(f) for f in files]
    if not os.path.isfile(path):
        raise MgcaffeError(f"{path}: no such image, folder or .npy file")
    return [load_image(path)]


def run(args) -> int:

    if args.gpu:
        mgcaffe.set_mode_gpu()
    channel_swap = _ints(args.channel_swap, "channel_swap") or None
    classifier = mgcaffe.Classifier(args.model_def, args.pretrained_model,
                                    image_dims=_ints(args.images_dim, "images_dim"),
                                    mean=_load_mean(args.mean_file),
                                    input_scale=args.input_scale, raw_scale=args.raw_scale,
                                    channel_swap=channel_swap)
    inputs = _load_inputs(args.input_file, args.ext)
    log.info("Classifying %d inputs.", len(inputs))
    scores = classifier.predict(inputs, oversample=not args.center_only)
    for i, row in enumerate(scores):
        top = np.argsort(row)[::-1][:5]
        log.info("input %d: top classes %s", i,
                 ", ".join(f"{int(c)} ({float(row[c]):.4f})" for c in top))
    np.save(args.output_file, scores)
    log.info("Saved to %s.", args.output_file)
    return 0
