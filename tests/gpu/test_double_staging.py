"""The executor's staged path (GPU gradients over a host communicator) on the CuPy double: the
averages are right, the copies go through pinned memory on a stream of their own, each
after its layer's event, and no thread touches a GPU other than its rank's."""

from __future__ import annotations

import cupy_double
import numpy as np
from comm_fakes import LAYERS, device_blobs, plan, run_ranks

from mgcaffe.comm.backends.local import LocalWorld
from mgcaffe.comm.runtime.executor import GradientExecutor


def test_staged_gradients_are_averaged_through_pinned_memory_on_a_copy_stream():
    world = LocalWorld(2, timeout=20)
    comms = world.communicators()
    with cupy_double.installed(devices=2) as double:
        cupy = double.cupy
        grads = {r: [np.random.default_rng(r).standard_normal(s).astype(np.float32)
                     for shapes in LAYERS.values() for s in shapes] for r in range(2)}

        def rank(r):
            cupy.cuda.Device(r).use()
            params, layers = device_blobs(cupy, flat=False)
            executor = GradientExecutor(layers, params, plan(["fc2", "fc1"], ["conv2", "conv1"]),
                                        comms[r], timeout=20)
            assert executor.mode == "staged"
            for layer in reversed(layers):
                for p in layer.param_ids:
                    params[p].diff[...] = cupy.asarray(grads[r][p])
                executor.on_learnable_done(layer.index)
            executor.wait()
            executor.close()
            return [p.diff.get() for p in params], params[0].diff.device.id

        results, errors = run_ranks(2, rank)
        assert errors == [None, None], errors
        c = double.counters
        streams = [s for s in c.launches_by_stream if s.startswith("stream")]
    for r in range(2):
        diffs, device = results[r]
        assert device == r
        for p, got in enumerate(diffs):
            np.testing.assert_allclose(got, (grads[0][p] + grads[1][p]) / 2, rtol=1e-6)
    assert len(streams) == 2  # one copy stream per rank
    assert c.d2h_pageable_bytes < c.d2h_bytes and c.h2d_pageable_bytes < c.h2d_bytes
    staged = sum(g.size * 4 for g in grads[0]) * 2  # both ranks, each way
    assert c.d2h_bytes - c.d2h_pageable_bytes == staged
    assert c.h2d_bytes - c.h2d_pageable_bytes == staged
