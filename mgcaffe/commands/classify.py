"""`mgcaffe classify`: score images with a trained net (Caffe's python/classify.py).

    mgcaffe classify INPUT OUTPUT.npy --model_def deploy.prototxt --pretrained_model w.caffemodel
                     [--images_dim 256,256] [--mean_file mean.npy|mean.binaryproto]
                     [--raw_scale 255] [--input_scale S] [--channel_swap 2,1,0]
                     [--center_only] [--ext jpg] [--gray] [--gpu]

INPUT is an image file, a folder (every *.EXT in it) or a .npy array of H x W x K images.
The scores (N x classes, the mean over ten crops unless --center_only) are saved to
OUTPUT.npy; the top classes of each image are logged. A net whose input has one channel
(LeNet, MNIST-style nets) gets its images in gray, without a channel swap; `--gray` asks for
gray images whatever the net.
"""

from __future__ import annotations

import glob
import logging
import os
from collections import Counter

import numpy as np

import mgcaffe

from ..errors import MgcaffeError
from ..formats.protoio import read_binaryproto
from ..io import load_image

NAME = "classify"
HELP = "score images with a trained net (Caffe's classify.py); save the scores as .npy"

log = logging.getLogger(__name__)


IMAGE_EXTENSIONS = {"jpg", "jpeg", "png", "bmp", "gif", "tif", "tiff", "ppm", "pgm", "webp"}


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
    parser.add_argument("--channel_swap", default=None,
                        help="channel order (default 2,1,0: RGB -> BGR, for a 3-channel "
                             "input; '' keeps RGB)")
    parser.add_argument("--center_only", action="store_true",
                        help="score the centre crop only, not the ten-crop mean")
    parser.add_argument("--ext", default="jpg", help="image extension for a folder (jpg)")
    parser.add_argument("--gray", action="store_true",
                        help="load the images as one gray channel (the default when the "
                             "net's input has one channel)")
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


def _load_inputs(path: str, ext: str, color: bool):

    if path.endswith(".npy"):
        return list(np.load(path))
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, f"*.{ext}")))
        if not files:
            found = Counter(os.path.splitext(f)[1][1:].lower() for f in os.listdir(path))
            others = [e for e, _ in found.most_common() if e in IMAGE_EXTENSIONS]
            raise MgcaffeError(f"{path}: no *.{ext} images in this folder (--ext {ext})"
                               + (f"; it holds *.{', *.'.join(others)} images: give --ext "
                                  f"{others[0]}" if others else ""))
        return [load_image(f, color) for f in files]
    if not os.path.isfile(path):
        raise MgcaffeError(f"{path}: no such image, folder or .npy file")
    return [load_image(path, color)]


def _channel_swap(args, channels: int) -> list[int] | None:
    """--channel_swap for a net of `channels` input channels: the default (RGB -> BGR)
    applies to three channels only; a swap given that does not fit is an error."""
    if args.channel_swap is None:  # Caffe's default, for the three channels it means
        return [2, 1, 0] if channels == 3 else None
    swap = _ints(args.channel_swap, "channel_swap") or None
    if swap is None or len(swap) == channels:
        return swap
    raise MgcaffeError(f"--channel_swap {args.channel_swap}: {len(swap)} channels, but the "
                       f"input of {args.model_def} has {channels}; give {channels} indices or "
                       f"--channel_swap ''")


def run(args) -> int:

    if args.gpu:
        mgcaffe.set_mode_gpu()
    classifier = mgcaffe.Classifier(args.model_def, args.pretrained_model,
                                    image_dims=_ints(args.images_dim, "images_dim"),
                                    mean=_load_mean(args.mean_file),
                                    input_scale=args.input_scale, raw_scale=args.raw_scale)
    in_ = classifier.inputs[0]
    shape = classifier.blobs[in_].data.shape
    channels = int(shape[1]) if len(shape) == 4 else 0
    if len(shape) != 4:
        raise MgcaffeError(f"{args.model_def}: input {in_!r} has shape {list(shape)}; "
                           "classify needs N x K x H x W images")
    swap = _channel_swap(args, channels)
    if swap is not None:
        classifier.transformer.set_channel_swap(in_, swap)
    gray = args.gray or channels == 1
    if gray and channels != 1:
        raise MgcaffeError(f"--gray: the input of {args.model_def} has {channels} channels, "
                           "not 1")
    inputs = _load_inputs(args.input_file, args.ext, color=not gray)
    if inputs and inputs[0].ndim == 3 and inputs[0].shape[2] != channels:
        raise MgcaffeError(f"{args.input_file}: images of {inputs[0].shape[2]} channel(s), but "
                           f"the input of {args.model_def} takes {channels}")
    log.info("Classifying %d inputs.", len(inputs))
    scores = classifier.predict(inputs, oversample=not args.center_only)
    for i, row in enumerate(scores):
        top = np.argsort(row)[::-1][:5]
        log.info("input %d: top classes %s", i,
                 ", ".join(f"{int(c)} ({float(row[c]):.4f})" for c in top))
    np.save(args.output_file, scores)
    log.info("Saved to %s.", args.output_file)
    return 0
