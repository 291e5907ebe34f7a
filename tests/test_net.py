"""Net: DAG building, splits, in-place, loss weights, backward rules, sharing, filtering,
reshaping, the learnable-layer hook, weights round trip and errors.

Tiny test-only layers (registered under "TN*" types) keep every expectation easy to compute
here independently of the real layer implementations.
"""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from mgcaffe.errors import NetError
from mgcaffe.layer_types.base import TEST, TRAIN, Layer
from mgcaffe.layer_types.registry import register_layer
from mgcaffe.net import Net
from mgcaffe.proto import caffe_pb2


# ----------------------------------------------------------------------------- test layers
@register_layer
class TNInput(Layer):
    """Tops shaped by input_param.shape; filled with a fixed ramp so runs are repeatable."""

    type = "TNInput"
    exact_num_bottom = 0

    def layer_setup(self, bottom, top):
        for t, s in zip(top, self.param.input_param.shape):
            t.reshape(tuple(s.dim))
            t.data[...] = np.linspace(-1, 1, t.count).reshape(t.shape)

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        pass


@register_layer
class TNLinear(Layer):
    """y = x.reshape(n, -1) @ W.T + b, W of shape (num_output, k)."""

    type = "TNLinear"
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        if not self.blobs:
            n = self.param.inner_product_param.num_output
            k = bottom[0].count // bottom[0].shape[0]
            self.blobs = [self.new_blob((n, k)), self.new_blob((n,))]
            self.blobs[0].data[...] = self.rng.standard_normal((n, k))
            self.blobs[1].data[...] = self.rng.standard_normal(n)

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape[0], self.blobs[0].shape[0])

    def forward(self, bottom, top):
        x = bottom[0].data.reshape(bottom[0].shape[0], -1)
        top[0].data[...] = x @ self.blobs[0].data.T + self.blobs[1].data

    def backward(self, top, propagate_down, bottom):
        x = bottom[0].data.reshape(bottom[0].shape[0], -1)
        dy = top[0].diff
        if self.param_propagate_down[0]:
            self.blobs[0].diff[...] += dy.T @ x
        if self.param_propagate_down[1]:
            self.blobs[1].diff[...] += dy.sum(0)
        if propagate_down[0]:
            bottom[0].diff[...] = (dy @ self.blobs[0].data).reshape(bottom[0].shape)


@register_layer
class TNReLU(Layer):
    type = "TNReLU"
    exact_num_bottom = 1
    exact_num_top = 1

    def reshape(self, bottom, top):
        if top[0] is not bottom[0]:
            top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        top[0].data[...] = np.maximum(bottom[0].data, 0)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            # In place, top data == max(x, 0): positive exactly where x was.
            bottom[0].diff[...] = top[0].diff * (top[0].data > 0)


@register_layer
class TNSum(Layer):
    """top = bottom0 + bottom1 (bottom 1 may not be forced to backprop)."""

    type = "TNSum"
    exact_num_bottom = 2
    exact_num_top = 1

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data + bottom[1].data

    def backward(self, top, propagate_down, bottom):
        for p, b in zip(propagate_down, bottom):
            if p:
                b.diff[...] = top[0].diff

    def allow_force_backward(self, bottom_index):
        return bottom_index == 0


@register_layer
class TNSquareLoss(Layer):
    """loss = 0.5 * sum(x^2); a loss layer (default weight 1)."""

    type = "TNSquareLoss"
    exact_num_bottom = 1
    exact_num_top = 1
    is_loss = True

    def reshape(self, bottom, top):
        top[0].reshape(())

    def forward(self, bottom, top):
        top[0].data[...] = 0.5 * np.sum(bottom[0].data ** 2)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = top[0].diff * bottom[0].data


@register_layer
class TNBroken(Layer):
    type = "TNBroken"

    def reshape(self, bottom, top):
        if self.param.loss_weight:
            raise ValueError("cannot size anything")
        for t in top:
            t.reshape((1,))

    def forward(self, bottom, top):
        raise FloatingPointError("boom")


# ----------------------------------------------------------------------------- helpers
def netparam(text: str) -> caffe_pb2.NetParameter:
    return text_format.Parse(text, caffe_pb2.NetParameter())


INPUT = """layer { name: "input" type: "TNInput" top: "data"
                   input_param { shape { dim: %d dim: 3 } } }"""


def lin(name, bottom, top, n=4, extra=""):
    return (f'layer {{ name: "{name}" type: "TNLinear" bottom: "{bottom}" top: "{top}" '
            f'inner_product_param {{ num_output: {n} }} {extra} }}')


def loss(name, bottom, extra=""):
    return (f'layer {{ name: "{name}" type: "TNSquareLoss" bottom: "{bottom}" '
            f'top: "{name}" {extra} }}')


def make(*layers, batch=2, force=False, phase=TRAIN, seed=1, input_type="TNInput", **kw):
    text = 'name: "t" ' + ("force_backward: true " if force else "") + \
        (INPUT % batch).replace("TNInput", input_type) + "".join(layers)
    return Net(netparam(text), phase, seed=seed, dtype=np.float64, **kw)


def chain():
    return make(lin("ip1", "data", "h"),
                'layer { name: "relu" type: "TNReLU" bottom: "h" top: "h" }',
                lin("ip2", "h", "out", n=2), loss("loss", "out"))


def manual_chain(net):
    """Forward and gradients of ip1 -> relu -> ip2 -> 0.5*sum(out^2), computed here."""
    x = net.blobs["data"].data.reshape(2, -1)
    w1, b1 = (p.data for p in net.params["ip1"])
    w2, b2 = (p.data for p in net.params["ip2"])
    h = np.maximum(x @ w1.T + b1, 0)
    out = h @ w2.T + b2
    d_out = out
    d_h = (d_out @ w2) * (h > 0)
    return {"loss": 0.5 * np.sum(out ** 2), "w2": d_out.T @ h, "b2": d_out.sum(0),
            "w1": d_h.T @ x, "b1": d_h.sum(0), "x": d_h @ w1}


# ----------------------------------------------------------------------------- building
def test_dag_names_inputs_outputs():
    net = chain()
    assert net.layer_names == ["input", "ip1", "relu", "ip2", "loss"]
    assert list(net.blobs) == ["data", "h", "out", "loss"]
    assert net.inputs == []  # only "Input" layers make net inputs, as in Caffe
    assert net.outputs == ["loss"]
    assert net.bottom_names["ip2"] == ["h"] and net.top_names["relu"] == ["h"]
    assert list(net.params) == ["ip1", "ip2"]
    assert net.blobs["out"].shape == (2, 2)


def test_outputs_sorted_by_name_like_caffes_set():
    net = make(lin("z", "data", "zz"), lin("a", "data", "aa"))
    assert net.outputs == ["aa", "zz"]


def test_in_place_top_is_the_same_blob():
    net = chain()
    layer_id = net.layer_id("relu")
    assert net._top_vecs[layer_id][0] is net._bottom_vecs[layer_id][0] is net.blobs["h"]


def test_forward_backward_match_manual_gradients():
    net = chain()
    expected = manual_chain(net)
    net.clear_param_diffs()
    loss_value = net.forward_backward()
    assert loss_value == pytest.approx(expected["loss"])
    np.testing.assert_allclose(net.params["ip2"][0].diff, expected["w2"])
    np.testing.assert_allclose(net.params["ip1"][0].diff, expected["w1"])
    np.testing.assert_allclose(net.params["ip1"][1].diff, expected["b1"])
    # The data input needs no diff without force_backward.
    assert not net.blobs["data"].diff.any()
    # Parameter diffs accumulate over backward calls; clear_param_diffs resets them.
    net.forward_backward()
    np.testing.assert_allclose(net.params["ip1"][0].diff, 2 * expected["w1"])


def test_split_inserted_with_caffe_names_and_diffs_summed():
    net = make(lin("a", "data", "ya", n=3), lin("b", "data", "yb", n=3),
               'layer { name: "sum" type: "TNSum" bottom: "ya" bottom: "yb" top: "s" }',
               loss("loss", "s"), force=True)
    assert "data_input_0_split" in net.layer_names
    assert net.top_names["data_input_0_split"] == ["data_input_0_split_0",
                                                   "data_input_0_split_1"]
    assert net.bottom_names["a"] == ["data_input_0_split_0"]
    assert net.bottom_names["b"] == ["data_input_0_split_1"]
    net.forward_backward()
    x = net.blobs["data"].data
    wa, ba = (p.data for p in net.params["a"])
    wb, bb = (p.data for p in net.params["b"])
    s = x @ wa.T + ba + x @ wb.T + bb
    np.testing.assert_allclose(net.blobs["data"].diff, s @ wa + s @ wb)


def test_loss_weight_split_and_blob_loss_weights():
    # "out" is both a weighted loss (2.0) and consumed by the loss layer (weight 0.5).
    net = make(lin("ip", "data", "out", n=2, extra="loss_weight: 2"),
               loss("loss", "out", extra="loss_weight: 0.5"))
    split = "out_ip_0_split"
    assert net.top_names[split] == ["out_ip_0_split_0", "out_ip_0_split_1"]
    assert net.blob_loss_weights["out_ip_0_split_0"] == 2.0
    assert net.blob_loss_weights["out_ip_0_split_1"] == 0.0
    assert net.blob_loss_weights["loss"] == 0.5
    loss_value = net.forward_backward()
    out = net.blobs["out"].data
    assert loss_value == pytest.approx(2.0 * out.sum() + 0.5 * 0.5 * np.sum(out ** 2))
    x = net.blobs["data"].data
    d_out = 2.0 + 0.5 * out
    np.testing.assert_allclose(net.params["ip"][0].diff, d_out.T @ x)


def test_layers_not_reaching_a_loss_skip_backward():
    net = make(lin("side", "data", "side"), lin("ip", "data", "out"), loss("loss", "out"))
    assert not net.layer_need_backward[net.layer_id("side")]
    assert net.layer_need_backward[net.layer_id("ip")]
    net.forward_backward()
    assert not net.params["side"][0].diff.any()
    assert net.params["ip"][0].diff.any()


def test_propagate_down_false_stops_bottom_diff_but_not_param_grads():
    net = make(lin("ip1", "data", "h"),
               lin("ip2", "h", "out", extra="propagate_down: false"), loss("loss", "out"))
    assert net.bottom_need_backward[net.layer_id("ip2")] == [False]
    # Nothing under ip2 gets a diff, so ip1 needs no backward at all.
    assert not net.layer_need_backward[net.layer_id("ip1")]
    net.forward_backward()
    assert net.params["ip2"][0].diff.any()
    assert not net.blobs["h"].diff.any()
    assert not net.params["ip1"][0].diff.any()


def test_force_backward_gives_input_diffs_respecting_allow_force_backward():
    layers = (lin("a", "data", "ya"), lin("b", "data", "yb"),
              'layer { name: "sum" type: "TNSum" bottom: "ya" bottom: "yb" top: "s" }',
              loss("loss", "s"))
    plain = make(*layers)
    assert plain.bottom_need_backward[0] == []
    assert not any(plain.bottom_need_backward[plain.layer_id("a")])
    forced = make(*layers, force=True)
    assert forced.bottom_need_backward[forced.layer_id("a")] == [True]
    # TNSum forbids forcing its second bottom, but yb needs a diff anyway (b has params).
    assert forced.bottom_need_backward[forced.layer_id("sum")] == [True, True]
    frozen = make(lin("a", "data", "ya"),
                  lin("b", "data", "yb", extra="param { lr_mult: 0 } param { lr_mult: 0 }"),
                  'layer { name: "sum" type: "TNSum" bottom: "ya" bottom: "yb" top: "s" }',
                  loss("loss", "s"), force=True)
    assert frozen.bottom_need_backward[frozen.layer_id("sum")] == [True, False]


def test_lr_mult_sets_param_propagate_down_and_learnable_layers():
    net = make(lin("ip1", "data", "h", extra="param { lr_mult: 0 } param { lr_mult: 0 }"),
               lin("ip2", "h", "h2", extra="param { lr_mult: 1 } param { lr_mult: 0 "
                   "decay_mult: 0 }"),
               lin("ip3", "h2", "out"), loss("loss", "out"))
    assert net.layers[net.layer_id("ip1")].param_propagate_down == [False, False]
    assert net.layers[net.layer_id("ip2")].param_propagate_down == [True, False]
    assert [(ll.index, ll.name) for ll in net.learnable_layers] == [(1, "ip2"), (2, "ip3")]
    ip2 = net.learnable_layers[0]
    assert ip2.param_ids == (2,) and ip2.count == net.params["ip2"][0].count
    assert net.params_lr == [0, 0, 1, 0, 1, 1]
    assert net.params_weight_decay == [1, 1, 1, 0, 1, 1]
    # ip1 is frozen and nothing below it learns: it needs no backward.
    assert not net.layer_need_backward[net.layer_id("ip1")]


# ----------------------------------------------------------------------------- sharing
def shared_net(extra_b="param { name: 'w' } param { name: 'bias' }", n_b=3):
    return make(lin("a", "data", "ya", n=3, extra="param { name: 'w' } param { name: 'bias' }"),
                lin("b", "data", "yb", n=n_b, extra=extra_b),
                'layer { name: "sum" type: "TNSum" bottom: "ya" bottom: "yb" top: "s" }',
                loss("loss", "s"))


def test_shared_params_alias_owner_and_accumulate_gradients():
    net = shared_net()
    a, b = net.params["a"], net.params["b"]
    assert np.shares_memory(a[0].data, b[0].data) and np.shares_memory(a[0].diff, b[0].diff)
    assert len(net.learnable_params) == 2 and net.param_owners == [-1, -1, 0, 1]
    assert [ll.name for ll in net.learnable_layers] == ["a"]
    net.forward_backward()
    x = net.blobs["data"].data.reshape(2, -1)
    w, bias = a[0].data, a[1].data
    s = 2 * (x @ w.T + bias)
    np.testing.assert_allclose(a[0].diff, 2 * s.T @ x)
    np.testing.assert_allclose(a[1].diff, 2 * s.sum(0))


def test_shared_param_shape_mismatch_names_both_layers():
    with pytest.raises(NetError, match=r"'b'.*'w'.*\(4, 3\).*'a'.*\(3, 3\)"):
        shared_net(n_b=4)


def test_shared_param_lr_mult_mismatch_is_an_error():
    with pytest.raises(NetError, match="lr_mult"):
        make(lin("a", "data", "ya", extra="param { name: 'w' lr_mult: 1 }"),
             lin("b", "data", "yb", extra="param { name: 'w' lr_mult: 2 }"))


# ----------------------------------------------------------------------------- filtering
def test_phase_level_and_stage_rules():
    layers = (lin("ip", "data", "out"),
              loss("train_only", "out", extra="include { phase: TRAIN }"),
              loss("test_only", "out", extra="include { phase: TEST }"),
              loss("deep", "out", extra="include { min_level: 2 }"),
              loss("staged", "out", extra="include { stage: 'x' }"),
              loss("not_staged", "out", extra="exclude { stage: 'x' }"))
    names = set(make(*layers).layer_names)
    assert {"train_only", "not_staged"} <= names
    assert not names & {"test_only", "deep", "staged"}
    names = set(make(*layers, phase=TEST, level=2, stages=("x",)).layer_names)
    assert {"test_only", "deep", "staged"} <= names
    assert not names & {"train_only", "not_staged"}


def test_layers_inherit_the_net_phase_unless_set():
    net = make(lin("ip", "data", "out"), lin("ip2", "out", "o2", extra="phase: TEST"),
               phase=TRAIN)
    assert net.layers[net.layer_id("ip")].phase == TRAIN
    assert net.layers[net.layer_id("ip2")].phase == TEST


# ----------------------------------------------------------------------------- reshape
def test_reshape_input_then_forward_propagates_shapes():
    net = chain()
    net.blobs["data"].reshape(5, 3)
    net.blobs["data"].data[...] = np.arange(15.0).reshape(5, 3) / 10
    net.forward()
    assert net.blobs["out"].shape == (5, 2)
    x = net.blobs["data"].data
    w1, b1 = (p.data for p in net.params["ip1"])
    w2, b2 = (p.data for p in net.params["ip2"])
    np.testing.assert_allclose(net.blobs["out"].data, np.maximum(x @ w1.T + b1, 0) @ w2.T + b2)
    # The loss weight survives the reallocation of the loss top.
    assert net.blobs["loss"].diff == 1.0
    net.blobs["data"].reshape(1, 3)
    net.reshape()
    assert net.blobs["h"].shape == (1, 4)


# ----------------------------------------------------------------------------- hook
def test_hook_order_and_param_diffs_final_when_it_fires():
    net = shared_net(extra_b="param { name: 'w' }")  # b shares a's weight, owns its bias
    more = make(lin("ip1", "data", "h"), lin("ip2", "h", "h2"),
                lin("ip3", "h2", "out", extra="param { name: 'w1' }"), loss("loss", "out"))
    for n in (net, more):
        seen = []
        snapshot = {}

        def hook(k, n=n, seen=seen, snapshot=snapshot):
            seen.append(k)
            ll = n.learnable_layers[k - 1]
            snapshot[k] = [n.learnable_params[i].diff.copy() for i in ll.param_ids]

        n.clear_param_diffs()
        n.forward_backward(on_learnable_done=hook)
        assert seen == list(range(len(n.learnable_layers), 0, -1))
        for ll in n.learnable_layers:
            for got, i in zip(snapshot[ll.index], ll.param_ids):
                np.testing.assert_array_equal(got, n.learnable_params[i].diff)
    assert [ll.name for ll in net.learnable_layers] == ["a", "b"]
    assert net.learnable_layers[1].param_ids == (2,)  # b owns only its bias


# ----------------------------------------------------------------------------- pycaffe API
def test_forward_and_backward_pycaffe_style():
    net = make(lin("ip", "data", "out", n=2), force=True, input_type="Input")  # no loss
    assert net.inputs == ["data"]
    x = np.ones((4, 3))
    with pytest.raises(NetError, match="Input is not batch sized"):  # pycaffe: reshape first
        net.forward(data=x)
    net.blobs["data"].reshape(4, 3)
    out = net.forward(data=x)
    w, b = (p.data for p in net.params["ip"])
    np.testing.assert_allclose(out["out"], x @ w.T + b)
    assert net.blobs["data"].shape == (4, 3)
    diffs = net.backward(out=np.ones((4, 2)))
    np.testing.assert_allclose(diffs["data"], np.ones((4, 2)) @ w)
    with pytest.raises(NetError, match="not one of the net inputs"):
        net.forward(nope=x)
    with pytest.raises(NetError, match="no layer named 'nope'"):
        net.forward(start="nope")


def test_forward_start_end():
    net = chain()
    got = net.forward(end="ip1")
    assert set(got) == {"h"}
    net.blobs["h"].data[...] = 1.0
    got = net.forward(start="ip2", blobs=["h"])
    w2, b2 = (p.data for p in net.params["ip2"])
    np.testing.assert_allclose(net.blobs["out"].data, np.ones((2, 4)) @ w2.T + b2)
    assert set(got) == {"loss", "h"}


# ----------------------------------------------------------------------------- weights
def test_seed_makes_initialisation_reproducible():
    a, b, c = chain(), chain(), make(lin("ip1", "data", "h"), seed=2)
    np.testing.assert_array_equal(a.params["ip1"][0].data, b.params["ip1"][0].data)
    assert not np.allclose(a.params["ip1"][0].data, c.params["ip1"][0].data)


def test_save_copy_from_round_trip(tmp_path):
    src = chain()
    path = tmp_path / "w.caffemodel"
    src.save(path)
    saved = caffe_pb2.NetParameter.FromString(path.read_bytes())
    ip1 = next(lp for lp in saved.layer if lp.name == "ip1")
    assert ip1.type == "TNLinear" and list(ip1.bottom) == ["data"]
    assert list(ip1.blobs[0].shape.dim) == [4, 3]
    dst = make(lin("ip1", "data", "h"),
               'layer { name: "relu" type: "TNReLU" bottom: "h" top: "h" }',
               lin("ip2", "h", "out", n=2), lin("new", "out", "z"), seed=7)
    new_init = dst.params["new"][0].data.copy()
    dst.copy_from(str(path))
    for name in ("ip1", "ip2"):
        for p, q in zip(src.params[name], dst.params[name]):
            np.testing.assert_allclose(p.data, q.data, rtol=1e-7)  # float32 file
    np.testing.assert_array_equal(dst.params["new"][0].data, new_init)
    # Weights given at construction, pycaffe's older positional form included.
    text = text_format.MessageToString(chain().net_param)
    (tmp_path / "n.prototxt").write_text(text)
    net = Net(str(tmp_path / "n.prototxt"), str(path), TEST, dtype=np.float64)
    np.testing.assert_allclose(net.params["ip2"][1].data, src.params["ip2"][1].data,
                               rtol=1e-7)


def test_copy_from_shape_and_count_errors():
    src = chain().to_proto()
    wrong = make(lin("ip1", "data", "h", n=5))
    with pytest.raises(NetError, match=r"'ip1' blob 0.*\(4, 3\).*\(5, 3\)"):
        wrong.copy_from(src)
    ip1 = next(lp for lp in src.layer if lp.name == "ip1")
    del ip1.blobs[1]
    with pytest.raises(NetError, match="'ip1' has 2 parameter blobs in the net but 1"):
        chain().copy_from(src)


def test_copy_from_legacy_4d_shape():
    net = chain()
    src = net.to_proto()
    ip1 = next(lp for lp in src.layer if lp.name == "ip1")
    values = np.arange(12.0).reshape(4, 3)
    blob = ip1.blobs[0]
    blob.ClearField("shape")
    blob.num, blob.channels, blob.height, blob.width = 1, 1, 4, 3
    del blob.data[:], blob.double_data[:]
    blob.data.extend(values.ravel())
    net.copy_from(src)
    np.testing.assert_array_equal(net.params["ip1"][0].data, values)
    blob.height, blob.width = 3, 4
    with pytest.raises(NetError, match="'ip1' blob 0"):
        net.copy_from(src)


# ----------------------------------------------------------------------------- errors
def test_graph_errors_name_the_layer_and_blob():
    with pytest.raises(NetError, match=r"'ip'.*unknown bottom blob 'nope'"):
        make(lin("ip", "nope", "out"))
    with pytest.raises(NetError, match=r"'ip2'.*top blob 'out'"):
        make(lin("ip", "data", "out"), lin("ip2", "data", "out"))
    with pytest.raises(NetError, match=r"'ip'.*propagate_down"):
        make(lin("ip", "data", "out", extra="propagate_down: true propagate_down: true"))
    with pytest.raises(NetError, match=r"'ip'.*3 param specs"):
        make(lin("ip", "data", "out", extra="param {} param {} param {}"))
    with pytest.raises(NetError, match=r"unknown layer type 'Nope'"):
        make('layer { name: "x" type: "Nope" bottom: "data" top: "y" }')


@pytest.mark.parametrize("typed, meant", [("Convoluton", "Convolution"),
                                          ("innerproduct", "InnerProduct"),
                                          ("SoftmaxWithLos", "SoftmaxWithLoss")])
def test_an_unknown_layer_type_suggests_the_closest(typed, meant):
    with pytest.raises(NetError) as info:
        make(f'layer {{ name: "x" type: "{typed}" bottom: "data" top: "y" }}')
    text = str(info.value)
    assert f"layer 'x': unknown layer type '{typed}'; did you mean '{meant}'?" in text
    assert "known types" not in text and len(text) < 200  # one short line, not 61 names
    with pytest.raises(NetError, match=r"unknown layer type 'Zzzq'; known types: .*Convolution"):
        make('layer { name: "x" type: "Zzzq" bottom: "data" top: "y" }')


def test_layer_failures_are_wrapped_with_the_layer_name():
    with pytest.raises(NetError, match=r"layer 'bad' \(TNBroken\): setup failed: "
                                       r"ValueError: cannot size"):
        make('layer { name: "bad" type: "TNBroken" top: "y" loss_weight: 1 }')
    net = make('layer { name: "bad" type: "TNBroken" top: "y" }')
    with pytest.raises(NetError, match=r"'bad' \(TNBroken\): forward failed: "
                                       r"FloatingPointError: boom"):
        net.forward()


def test_blobs_inside_the_model_are_used_instead_of_fillers():
    src = chain()
    again = Net(src.to_proto(), seed=99, dtype=np.float64)
    assert again.layer_names == src.layer_names
    for p, q in zip(src.learnable_params, again.learnable_params):
        np.testing.assert_array_equal(p.data, q.data)
    assert not again.net_param.layer[1].blobs  # values live in the Blobs only


def test_close_stops_layers_and_set_input_arrays_feeds_memory_data():
    import numpy as np

    from mgcaffe.errors import NetError
    from mgcaffe.formats.protoio import parse_net_text
    from mgcaffe.net import Net

    text = """
    layer { name: "mem" type: "MemoryData" top: "data" top: "label"
            memory_data_param { batch_size: 2 channels: 1 height: 1 width: 3 } }
    layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
            inner_product_param { num_output: 2 } }
    """
    net = Net(parse_net_text(text, source="test"), seed=1)
    data = np.arange(12, dtype=np.float32).reshape(4, 1, 1, 3)
    net.set_input_arrays(data, np.array([0, 1, 0, 1], dtype=np.float32))
    net.forward()
    np.testing.assert_array_equal(net.blobs["data"].data, data[:2])
    closed = []
    net.layers[0].close = lambda: closed.append(True)
    with net:
        pass
    assert closed == [True]

    plain = Net(parse_net_text("""
    layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 } } }
    """, source="test"))
    with pytest.raises(NetError, match="MemoryData"):
        plain.set_input_arrays(data, data)
