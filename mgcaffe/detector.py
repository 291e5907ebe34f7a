"""Detector: score given windows of images with a TEST-phase Net (pycaffe's caffe.Detector,
R-CNN style).

    det = mgcaffe.Detector("deploy.prototxt", "weights.caffemodel", mean=mean, raw_scale=255,
                           channel_swap=(2, 1, 0), context_pad=16)
    found = det.detect_windows([("img.jpg", np.array([[ymin, xmin, ymax, xmax], ...]))])
    # [{"window": ..., "prediction": scores, "filename": "img.jpg"}, ...]

Each window is cut from the image (with `context_pad` pixels of context, measured at the
net's input size, the part outside the image filled with the mean), warped to the net's
input size, preprocessed and scored. Proposals must be given: pycaffe's
`detect_selective_search` needs a MATLAB selective-search package and is not provided.
"""

from __future__ import annotations

import numpy as np

import mgcaffe

from . import io as caffe_io
from .classifier import input_transformer
from .layer_types.base import TEST


def _pycaffe_net():

    return mgcaffe.Net


class Detector(_pycaffe_net()):
    """See the module docstring; preprocessing options as in `mgcaffe.Classifier`."""

    def __init__(self, model_file, pretrained_file, mean=None, input_scale=None,
                 raw_scale=None, channel_swap=None, context_pad=None, **net_options):
        super().__init__(model_file, TEST, weights=pretrained_file, **net_options)
        self.transformer = input_transformer(self, mean, input_scale, raw_scale, channel_swap)
        self.configure_crop(context_pad)

    def configure_crop(self, context_pad) -> None:
        """Set the crop size (the net's H x W x K) and the context padding; the fill of
        padding outside the image is the mean, taken back to image space."""
        in_ = self.inputs[0]
        _, channels, height, width = self.blobs[in_].data.shape
        self.crop_dims = np.array((height, width, channels))
        self.context_pad = context_pad
        mean = self.transformer.mean.get(in_)
        if mean is None:
            self.crop_mean = np.zeros(self.crop_dims, dtype=np.float32)
            return
        mean = np.broadcast_to(mean, (channels, height, width)).astype(np.float32)
        swap = self.transformer.channel_swap.get(in_)
        if swap is not None:  # the mean is in net channel order; the crop in image order
            mean = mean[np.argsort(swap)]
        raw_scale = self.transformer.raw_scale.get(in_)
        self.crop_mean = mean.transpose(1, 2, 0) / (raw_scale if raw_scale else 1.0)

    def crop(self, im, window) -> np.ndarray:
        """The image region of `window` (ymin, xmin, ymax, xmax), with context if set."""
        window = np.asarray(window, dtype=int)
        if not self.context_pad:
            return im[window[0]:window[2], window[1]:window[3]]
        size_h, size_w = int(self.crop_dims[0]), int(self.crop_dims[1])
        # Grow the box so that, warped to the input size, it has context_pad pixels around.
        scale = size_w / (size_w - 2.0 * self.context_pad)
        half = np.array([(window[2] - window[0] + 1) / 2.0, (window[3] - window[1] + 1) / 2.0])
        centre = window[:2] + half
        box = np.round(np.concatenate([centre - scale * half, centre + scale * half]))
        scale_h = size_h / (box[2] - box[0] + 1)
        scale_w = size_w / (box[3] - box[1] + 1)
        pad_y = int(round(max(0.0, -box[0]) * scale_h))
        pad_x = int(round(max(0.0, -box[1]) * scale_w))
        im_h, im_w = im.shape[:2]
        box = np.clip(box, 0, [im_h, im_w, im_h, im_w]).astype(int)
        crop_h = min(int(round((box[2] - box[0] + 1) * scale_h)), size_h - pad_y)
        crop_w = min(int(round((box[3] - box[1] + 1) * scale_w)), size_w - pad_x)
        out = np.array(self.crop_mean, dtype=np.float32, copy=True)
        region = im[box[0]:box[2], box[1]:box[3]]
        if crop_h > 0 and crop_w > 0 and region.size:
            out[pad_y:pad_y + crop_h, pad_x:pad_x + crop_w] = \
                caffe_io.resize_image(region, (crop_h, crop_w))
        return out

    def detect_windows(self, images_windows) -> list[dict]:
        """Scores of every window: [(image path, windows array)] -> one dict per window."""
        crops, where = [], []
        in_ = self.inputs[0]
        for filename, windows in images_windows:
            image = caffe_io.load_image(filename).astype(np.float32)
            for window in windows:
                crops.append(self.transformer.preprocess(in_, self.crop(image, window)))
                where.append((filename, window))
        if not crops:
            return []
        scores = self.forward_all(**{in_: np.stack(crops)})[self.outputs[0]]
        scores = scores.reshape(len(crops), -1)
        return [{"window": window, "prediction": scores[i], "filename": filename}
                for i, (filename, window) in enumerate(where)]

    def detect_selective_search(self, image_fnames):
        """Not provided: pass proposals to detect_windows instead."""
        raise NotImplementedError("detect_selective_search needs the MATLAB selective "
                                  "search package; compute proposals and use "
                                  "detect_windows(images_windows)")
