"""Classifier: a TEST-phase Net that scores images (pycaffe's caffe.Classifier).

    net = mgcaffe.Classifier("deploy.prototxt", "weights.caffemodel",
                             image_dims=(256, 256), mean=mean_bgr, raw_scale=255,
                             channel_swap=(2, 1, 0))
    scores = net.predict([mgcaffe.io.load_image("cat.jpg")])   # N x classes

Images (H x W x K float arrays in [0, 1], as `mgcaffe.io.load_image` gives) are resized to
`image_dims`, then either cut into the ten crops of `mgcaffe.io.oversample` (the scores are
their mean) or centre-cropped to the net's input size, preprocessed by `self.transformer`
(transpose to K x H x W, channel swap, raw scale, mean, input scale) and run through the net
in batches of its input size.
"""

from __future__ import annotations

import numpy as np

import mgcaffe

from . import io as caffe_io
from .layer_types.base import TEST


def _pycaffe_net():

    return mgcaffe.Net


def input_transformer(net, mean=None, input_scale=None, raw_scale=None, channel_swap=None):
    """The Transformer of `net`'s first input that Classifier and Detector preprocess with:
    H x W x K images to K x H x W, then each option that is given."""
    in_ = net.inputs[0]
    transformer = caffe_io.Transformer({in_: net.blobs[in_].data.shape})
    transformer.set_transpose(in_, (2, 0, 1))
    if mean is not None:
        transformer.set_mean(in_, mean)
    if input_scale is not None:
        transformer.set_input_scale(in_, input_scale)
    if raw_scale is not None:
        transformer.set_raw_scale(in_, raw_scale)
    if channel_swap is not None:
        transformer.set_channel_swap(in_, channel_swap)
    return transformer


class Classifier(_pycaffe_net()):
    """See the module docstring. `mean`: per channel (K,) or K x H x W, in the net's
    channel order; scales and channel_swap as in `mgcaffe.io.Transformer`."""

    def __init__(self, model_file, pretrained_file, image_dims=None, mean=None,
                 input_scale=None, raw_scale=None, channel_swap=None, **net_options):
        super().__init__(model_file, TEST, weights=pretrained_file, **net_options)
        in_ = self.inputs[0]
        self.transformer = input_transformer(self, mean, input_scale, raw_scale, channel_swap)
        self.crop_dims = np.array(self.blobs[in_].data.shape[2:])
        self.image_dims = np.array(image_dims if image_dims is not None else self.crop_dims)

    def predict(self, inputs, oversample: bool = True) -> np.ndarray:
        """Scores (N x classes) of N images; with oversample, the mean over ten crops."""
        h, w = (int(d) for d in self.image_dims)
        resized = np.zeros((len(inputs), h, w, inputs[0].shape[2]), dtype=np.float32)
        for i, image in enumerate(inputs):
            resized[i] = caffe_io.resize_image(image, (h, w))
        if oversample:
            crops = caffe_io.oversample(resized, self.crop_dims)
        else:
            ch, cw = (int(d) for d in self.crop_dims)
            top, left = int(h / 2.0 - ch / 2.0), int(w / 2.0 - cw / 2.0)
            crops = resized[:, top:top + ch, left:left + cw, :]
        in_ = self.inputs[0]
        caffe_in = np.stack([self.transformer.preprocess(in_, crop) for crop in crops])
        scores = self.forward_all(**{in_: caffe_in})[self.outputs[0]]
        if oversample:
            scores = scores.reshape((len(scores) // 10, 10, -1)).mean(1)
        return scores
