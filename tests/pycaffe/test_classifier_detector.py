"""Classifier, Detector and `mgcaffe classify` against the pipeline written out by hand on a
linear net (scores = W x + b), so every crop, swap, scale and mean is visible."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from PIL import Image

import mgcaffe
from mgcaffe.cli import main
from mgcaffe.proto import caffe_pb2

DEPLOY = """
name: "linear"
layer { name: "data" type: "Input" top: "data"
  input_param { shape { dim: 2 dim: 3 dim: 4 dim: 4 } } }
layer { name: "score" type: "InnerProduct" bottom: "data" top: "score"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 1 }
                        bias_filler { type: "gaussian" std: 1 } } }
"""
MEAN = np.array([0.1, 0.2, 0.3])


@pytest.fixture
def model(tmp_path):
    deploy = tmp_path / "deploy.prototxt"
    deploy.write_text(DEPLOY)
    net = mgcaffe.Net(str(deploy), mgcaffe.TEST, seed=3)
    weights = tmp_path / "w.caffemodel"
    net.save(str(weights))
    w, b = (p.data.astype(np.float64) for p in net.params["score"])
    return str(deploy), str(weights), w, b


def by_hand(crop_hwc, w, b, swap=(2, 1, 0), raw_scale=2.0, mean=MEAN):
    chw = crop_hwc.transpose(2, 0, 1)[list(swap)] * raw_scale - mean[:, None, None]
    return w @ chw.ravel() + b


def test_classifier_centre_crop_and_ten_crops(model):
    deploy, weights, w, b = model
    clf = mgcaffe.Classifier(deploy, weights, image_dims=(6, 6), mean=MEAN, raw_scale=2.0,
                             channel_swap=(2, 1, 0))
    images = list(np.random.default_rng(0).uniform(0, 1, (3, 6, 6, 3)))  # 3 > batch 2
    centre = clf.predict(images, oversample=False)
    assert centre.shape == (3, 3)
    expected = [by_hand(im[1:5, 1:5], w, b) for im in images]
    np.testing.assert_allclose(centre, expected, rtol=1e-4, atol=1e-4)
    ten = clf.predict(images)
    corners = [(0, 0), (0, 2), (2, 0), (2, 2), (1, 1)]
    expected = []
    for im in images:
        crops = [im[y:y + 4, x:x + 4] for y, x in corners]
        crops += [c[:, ::-1] for c in crops]
        expected.append(np.mean([by_hand(c, w, b) for c in crops], axis=0))
    np.testing.assert_allclose(ten, expected, rtol=1e-4, atol=1e-4)


def test_detector_windows_and_context(model, tmp_path):
    deploy, weights, w, b = model
    pixels = np.random.default_rng(1).integers(0, 256, (8, 7, 3), dtype=np.uint8)
    path = tmp_path / "im.png"
    Image.fromarray(pixels).save(path)
    image = pixels.astype(np.float64) / 255
    det = mgcaffe.Detector(deploy, weights, mean=MEAN, raw_scale=2.0, channel_swap=(2, 1, 0))
    windows = np.array([[0, 0, 4, 4], [3, 2, 7, 6], [1, 1, 5, 5]])
    found = det.detect_windows([(str(path), windows)])
    assert [d["filename"] for d in found] == [str(path)] * 3
    for d, (y0, x0, y1, x1) in zip(found, windows):
        np.testing.assert_array_equal(d["window"], [y0, x0, y1, x1])
        np.testing.assert_allclose(d["prediction"], by_hand(image[y0:y1, x0:x1], w, b),
                                   rtol=1e-4, atol=1e-4)
    # With context padding, a window at the corner reaches outside the image: that part
    # is filled with the mean, taken back to image space (RGB order, / raw_scale).
    padded = mgcaffe.Detector(deploy, weights, mean=MEAN, raw_scale=2.0,
                              channel_swap=(2, 1, 0), context_pad=1)
    crop = padded.crop(image.astype(np.float32), np.array([0, 0, 3, 3]))
    assert crop.shape == (4, 4, 3)
    np.testing.assert_allclose(crop[0, 0], MEAN[::-1] / 2.0, rtol=1e-6)
    assert padded.detect_windows([]) == []


def test_classify_command(model, tmp_path):
    deploy, weights, w, b = model
    images = np.random.default_rng(2).uniform(0, 1, (3, 4, 4, 3))
    np.save(tmp_path / "in.npy", images)
    out = tmp_path / "out.npy"
    code = main(["classify", str(tmp_path / "in.npy"), str(out), "--model_def", deploy,
                 "--pretrained_model", weights, "--images_dim", "4,4", "--center_only",
                 "--channel_swap", "", "--raw_scale", "1"])
    assert code == 0
    scores = np.load(out)
    expected = [by_hand(im, w, b, swap=(0, 1, 2), raw_scale=1.0, mean=np.zeros(3))
                for im in images]
    np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-4)
    missing = main(["classify", str(tmp_path / "nope.jpg"), str(out), "--model_def", deploy,
                    "--pretrained_model", weights])
    assert missing == 1


def test_classifier_is_a_net(model):
    deploy, weights, _, _ = model
    clf = mgcaffe.Classifier(deploy, weights)
    assert isinstance(clf, mgcaffe.Net) and clf.phase == mgcaffe.TEST
    assert list(clf.image_dims) == [4, 4]
    assert text_format.MessageToString(clf.net_param).count("layer {") == 2
    assert caffe_pb2.TEST == clf.phase


GRAY_DEPLOY = """
name: "gray"
layer { name: "data" type: "Input" top: "data"
  input_param { shape { dim: 1 dim: 1 dim: 4 dim: 4 } } }
layer { name: "score" type: "InnerProduct" bottom: "data" top: "score"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 1 } } }
"""


def test_classify_command_on_a_one_channel_net(tmp_path, capsys):
    """A LeNet-style net takes one channel: the images are read in gray and the RGB -> BGR
    default is left out (it was a traceback); a swap that cannot fit is one line."""
    deploy = tmp_path / "gray.prototxt"
    deploy.write_text(GRAY_DEPLOY)
    net = mgcaffe.Net(str(deploy), mgcaffe.TEST, seed=5)
    weights = tmp_path / "gray.caffemodel"
    net.save(str(weights))
    w = net.params["score"][0].data.astype(np.float64)
    pixels = np.random.default_rng(4).integers(0, 256, (4, 4, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "im.png")
    out = tmp_path / "out.npy"
    base = ["classify", str(tmp_path / "im.png"), str(out), "--model_def", str(deploy),
            "--pretrained_model", str(weights), "--images_dim", "4,4", "--center_only",
            "--raw_scale", "1"]
    assert main(base) == 0
    gray = np.asarray(Image.fromarray(pixels).convert("L"), dtype=np.float64) / 255
    np.testing.assert_allclose(np.load(out)[0], w @ gray.ravel(), rtol=1e-4, atol=1e-4)
    capsys.readouterr()
    assert main([*base, "--channel_swap", "2,1,0"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.splitlines()[-1] == (
        f"mgcaffe classify: error: --channel_swap 2,1,0: 3 channels, but the input of {deploy} "
        "has 1; give 1 indices or --channel_swap ''")


def test_classify_command_names_ext_when_a_folder_holds_none(model, tmp_path, capsys):
    deploy, weights, _, _ = model
    folder = tmp_path / "pics"
    folder.mkdir()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(folder / "a.png")
    assert main(["classify", str(folder), str(tmp_path / "o.npy"), "--model_def", deploy,
                 "--pretrained_model", weights]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"mgcaffe classify: error: {folder}: no *.jpg images in this folder (--ext jpg); it "
        "holds *.png images: give --ext png")


def test_classify_command_swaps_rgb_to_bgr_by_default_on_three_channels(model, tmp_path):
    deploy, weights, w, b = model
    images = np.random.default_rng(6).uniform(0, 1, (2, 4, 4, 3))
    np.save(tmp_path / "in.npy", images)
    out = tmp_path / "out.npy"
    assert main(["classify", str(tmp_path / "in.npy"), str(out), "--model_def", deploy,
                 "--pretrained_model", weights, "--images_dim", "4,4", "--center_only",
                 "--raw_scale", "1"]) == 0
    expected = [by_hand(im, w, b, swap=(2, 1, 0), raw_scale=1.0, mean=np.zeros(3))
                for im in images]
    np.testing.assert_allclose(np.load(out), expected, rtol=1e-4, atol=1e-4)
