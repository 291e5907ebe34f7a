"""The registry holds every layer type BVLC Caffe master registers (REGISTER_LAYER_CLASS /
REGISTER_LAYER_CREATOR in src/caffe/layers and layer_factory.cpp), written out here."""

from __future__ import annotations

import mgcaffe
from mgcaffe.layer_types import layer_class, layer_types


def shipped_types() -> set[str]:
    """Registered types implemented in mgcaffe (tests register throw-away types too)."""
    return {t for t in layer_types() if layer_class(t).__module__.startswith("mgcaffe.")}

#: BVLC Caffe master's 61 registered types.
BVLC_MASTER_TYPES = sorted("""
AbsVal Accuracy ArgMax BNLL BatchNorm BatchReindex Bias Clip Concat ContrastiveLoss
Convolution Crop Data Deconvolution Dropout DummyData ELU Eltwise Embed EuclideanLoss Exp
Filter Flatten HDF5Data HDF5Output HingeLoss Im2col ImageData InfogainLoss InnerProduct Input
LRN LSTM LSTMUnit Log MVN MemoryData MultinomialLogisticLoss PReLU Parameter Pooling Power
Python RNN ReLU Reduction Reshape SPP Scale Sigmoid SigmoidCrossEntropyLoss Silence Slice
Softmax SoftmaxWithLoss Split Swish TanH Threshold Tile WindowData
""".split())


def test_the_list_has_61_types():
    assert len(BVLC_MASTER_TYPES) == 61 == len(set(BVLC_MASTER_TYPES))


def test_registry_holds_caffe_master_types():
    registered = shipped_types()
    # The Python layer comes with the pycaffe-compatible layer support; all others are here.
    expected = set(BVLC_MASTER_TYPES) - ({"Python"} - registered)
    assert len(expected) in (60, 61)
    assert sorted(registered) == sorted(expected)


def test_layer_type_list_agrees_with_the_registry():
    listing = getattr(mgcaffe, "layer_type_list", None)
    if listing is not None:  # pycaffe's name for the same list
        assert shipped_types() <= set(listing())
