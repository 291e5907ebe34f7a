"""Gradient compression on the wire (float16, bfloat16) in the one communication thread:
every kind of schedule on fake ranks (threads), the numerics against a reference written
here in numpy, the float32 resend of a message that overflows, and the formats a path
refuses."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest
from comm_fakes import GROUPS, SCHEDULES, FakeNet, flatten, run_ranks

from mgcaffe.comm.backends.local import LocalWorld
from mgcaffe.comm.runtime.executor import GradientExecutor
from mgcaffe.errors import CommError


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bfloat16 value (ties to even), as float32: 8 significant bits
    kept by frexp/rint (independent of the code's bit arithmetic)."""
    x64 = x.astype(np.float64)
    m, e = np.frexp(x64)  # x = m * 2**e, 0.5 <= |m| < 1
    return np.ldexp(np.rint(m * 256.0) / 256.0, e).astype(np.float32)


def round_to(fmt: str, x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32) if fmt == "float16" else round_bf16(x)


def reference(per_rank: list[np.ndarray], fmt: str) -> np.ndarray:
    """What every rank should hold: each rank's gradient divided by the world size and
    rounded to the format, summed in float32 in rank order, the sum rounded once."""
    n = len(per_rank)
    total = np.zeros_like(per_rank[0])
    for g in per_rank:
        total += round_to(fmt, (g / np.float32(n)).astype(np.float32))
    return round_to(fmt, total)


def run(n, plan, iterations=2, in_place=True, poke=None, seed=3):
    """n fake ranks through an executor; per rank, per iteration, its reduced diffs; and
    each rank's own gradients (what backward wrote) for the reference."""
    comms = LocalWorld(n).communicators()
    nets = [FakeNet(r, seed=seed) for r in range(n)]
    if in_place:
        for net in nets:
            flatten(net)

    def rank(r):
        ex = GradientExecutor.from_net(nets[r], plan, comms[r], timeout=10)
        got, own = [], []
        for it in range(iterations):
            mine = []

            def hook(k, r=r, it=it, mine=mine):
                if poke is not None:
                    poke(r, it, k, nets[r])
                mine.extend(nets[r].learnable_params[p].diff.copy()
                            for p in nets[r].learnable_layers[k - 1].param_ids)
                ex.on_learnable_done(k)

            nets[r].backward(hook)
            if ex.per_layer:
                for k in (1, 2, 3, 4):
                    ex.wait_layer(k)
            else:
                ex.wait()
            got.append(nets[r].diffs())
            own.append(mine)
        ex.close()
        return got, own, ex

    results, errors = run_ranks(n, rank)
    assert not any(errors), errors
    return results


def by_param(net_layers, own):
    """The hook's per-layer copies (backward order) back in parameter order."""
    out = {}
    i = 0
    for layer in reversed(net_layers):
        for p in layer.param_ids:
            out[p] = own[i]
            i += 1
    return [out[p] for p in sorted(out)]


@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", list(SCHEDULES))
@pytest.mark.parametrize("in_place", [True, False], ids=["in place", "packed"])
def test_compressed_messages_equal_the_numpy_reference(fmt, name, in_place):
    n = 3
    plan = SimpleNamespace(groups=GROUPS, schedule=SCHEDULES[name], formats=[fmt, fmt])
    results = run(n, plan, in_place=in_place)
    layers = FakeNet().learnable_layers
    for it in range(2):
        grads = [by_param(layers, results[r][1][it]) for r in range(n)]
        for p in range(len(grads[0])):
            want = reference([g[p] for g in grads], fmt)
            for r in range(n):
                np.testing.assert_array_equal(results[r][0][it][p], want)
    assert all(res[2].fallbacks == 0 for res in results)


def test_one_group_compressed_the_other_float32():
    """Formats per group: the float16 group matches the reference, the float32 group the
    plain average (sum / n), in one schedule that batches across them."""
    n = 2
    plan = SimpleNamespace(groups=GROUPS, schedule=SCHEDULES["batches"],
                           formats=["float16", "float32"])
    results = run(n, plan)
    layers = FakeNet().learnable_layers
    fc = {p for layer in layers if layer.name in GROUPS[0] for p in layer.param_ids}
    grads = [by_param(layers, results[r][1][0]) for r in range(n)]
    for p in range(len(grads[0])):
        if p in fc:
            want = reference([g[p] for g in grads], "float16")
        else:
            want = (grads[0][p] + grads[1][p]) / np.float32(n)
        np.testing.assert_array_equal(results[0][0][0][p], want)


@pytest.mark.parametrize("fmt,huge", [("float16", 2e5), ("bfloat16", np.inf)])
@pytest.mark.parametrize("name", ["barrier", "reduce-scatter, all-gather"])
def test_an_overflowing_message_is_sent_again_in_float32(fmt, huge, name, caplog):
    """A value past the format's range on one rank (after the division; float16: 2e5 / 2 >
    65504) or not finite at all (bfloat16 has float32's range) makes the reduced payload
    non-finite on every rank: that message is sent again in float32 (the plain average),
    the other stays compressed, and one line per iteration says how many."""
    n = 2

    def poke(r, it, k, net):
        if r == 1 and it == 0 and k == 4:  # fc2, in the first group
            net.learnable_params[net.learnable_layers[3].param_ids[0]].diff.flat[0] = huge

    plan = SimpleNamespace(groups=GROUPS, schedule=SCHEDULES[name], formats=[fmt, fmt])
    with caplog.at_level(logging.WARNING, logger="mgcaffe.comm"):
        results = run(n, plan, poke=poke)
    layers = FakeNet().learnable_layers
    fc = {p for layer in layers if layer.name in GROUPS[0] for p in layer.param_ids}
    for it in range(2):
        grads = [by_param(layers, results[r][1][it]) for r in range(n)]
        for p in range(len(grads[0])):
            if it == 0 and p in fc:  # the resent group: float32 sum, then divided
                want = (grads[0][p] + grads[1][p]) / np.float32(n)
            else:
                want = reference([g[p] for g in grads], fmt)
            np.testing.assert_array_equal(results[0][0][it][p], want)
            if np.isfinite(huge):  # no NaN from an overflow the format alone caused
                assert np.isfinite(results[1][0][it][p]).all()
    assert [res[2].fallbacks for res in results] == [1, 1]
    lines = [r.getMessage() for r in caplog.records if "sent again in float32" in r.message]
    assert len(lines) == 2 and all("iteration 1: 1 compressed" in x for x in lines), lines


def test_a_path_without_the_format_refuses_it_in_one_line():
    comms = LocalWorld(1).communicators()
    comms[0].wires = ("float32", "float16")  # as a device path without bfloat16
    plan = SimpleNamespace(groups=GROUPS, formats=["bfloat16", "float32"])
    with pytest.raises(CommError) as err:
        GradientExecutor.from_net(FakeNet(0), plan, comms[0], timeout=5)
    msg = str(err.value)
    assert "\n" not in msg and "bfloat16 is not available" in msg and "float16" in msg


def test_plan_formats_must_match_its_groups():
    comms = LocalWorld(1).communicators()
    plan = SimpleNamespace(groups=GROUPS, formats=["float16"])
    with pytest.raises(CommError, match="1 wire formats for 2 groups"):
        GradientExecutor.from_net(FakeNet(0), plan, comms[0], timeout=5)
