"""The test phase and the output lines: Caffe's Solver::Test (test_iter forward passes of a
test net, its outputs averaged) and the "Train/Test net output #i" lines both phases log,
in Caffe's wording and number format (its log parsers read them)."""

from __future__ import annotations

import logging

import numpy as np

from ..backend import to_host
from . import progress

log = logging.getLogger("mgcaffe.solvers")


def number(x: float) -> str:
    """A number as C++ ostream prints a float (6 significant digits), as Caffe's logs show."""
    return f"{float(x):.6g}"


def output_values(net) -> list[np.ndarray]:
    """Each output blob's values, flattened on the host, in net.outputs order."""
    return [to_host(net.blobs[name].data).astype(np.float64).ravel() for name in net.outputs]


def log_outputs(net, which: str, values: list[np.ndarray], divisor: int) -> None:
    """The "<which> net output #i: name = v" lines, each value divided by `divisor`; a loss
    output also shows its weighted contribution."""
    index = 0
    for name, vec in zip(net.outputs, values):
        weight = float(net.blob_loss_weights.get(name, 0.0))
        for v in vec:
            v = float(np.float32(v / divisor))
            extra = f" (* {number(weight)} = {number(weight * v)} loss)" if weight else ""
            log.info("    %s net output #%d: %s = %s%s", which, index, name, number(v), extra)
            index += 1


def run_test(solver, k: int) -> None:
    """Average test net k's outputs over test_iter[k] forward passes and log them; snapshot
    and stop requests are served between passes, as in training."""
    log.info("Iteration %d, Testing net (#%d)", solver.iter, k)
    net = solver.test_nets[k]
    net.share_weights(solver.net)
    n = solver.param.test_iter[k]
    net.debug_info = bool(solver.param.debug_info)
    scores = None
    loss = 0.0
    ticker = progress.Ticker(f"Test pass (#{k})", n)
    for i in range(n):
        ticker.tick(i)
        if solver.serve_requests():
            log.info("Test interrupted.")
            return
        net.forward()
        loss += net.loss
        values = output_values(net)
        scores = values if scores is None else [s + v for s, v in zip(scores, values)]
    if solver.param.test_compute_loss:
        log.info("Test loss: %s", number(loss / n))
    log_outputs(net, "Test", scores or [], n)
