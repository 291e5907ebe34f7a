"""Checks of the communication runtime under a real MPI launcher (run by tests/comm/test_*.py).

    mpiexec -n 2 python tests/mpi/comm_checks.py CASE [OPTIONS]

Each rank prints `OK CASE rank R` (and, for measurements, one JSON line `RESULT {...}`) and
exits 0 when its checks pass. Any failure goes through `fail_all`, so every rank ends non-zero.
Fault cases (`raise-main`, `raise-thread`, `sigkill`, `stall`) are expected to end every rank
non-zero within the timeout; they print `FAULT CASE rank R` just before the fault.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

import numpy as np
from comm_fakes import FakeNet, plan

from mgcaffe.comm.runtime.executor import GradientExecutor
from mgcaffe.comm.runtime.trace import Tracer
from mgcaffe.comm.training.faults import Watchdog, fail_all
from mgcaffe.comm.training.world import world

PLANS = {
    "wfbp": plan(["fc2"], ["fc1"], ["conv2"], ["conv1"]),
    "synceasgd": plan(["fc2", "fc1", "conv2", "conv1"]),
    "merged": plan(["fc2", "fc1"], ["conv2", "conv1"]),
}


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def case_collectives(comm, args):
    n, r = comm.size, comm.rank
    buf = np.arange(1000, dtype=np.float32) * (r + 1)
    comm.allreduce_sum(buf)
    check(np.array_equal(buf, np.arange(1000, dtype=np.float32) * (n * (n + 1) / 2)),
          "allreduce_sum")
    if hasattr(comm, "chunk_bytes"):  # MPI: a buffer over the chunk size goes in pieces
        saved, comm.chunk_bytes = comm.chunk_bytes, 4000
        pieces = np.arange(2501, dtype=np.float32).reshape(41, 61) * (r + 1)  # 3 pieces
        comm.allreduce_sum(pieces)
        comm.chunk_bytes = saved
        check(np.array_equal(pieces, np.arange(2501, dtype=np.float32).reshape(41, 61) *
                             (n * (n + 1) / 2)), "allreduce_sum in pieces")
    rng = np.random.default_rng(r)
    noisy = rng.standard_normal(100_000).astype(np.float32)
    comm.allreduce_sum(noisy)
    check(len({bytes(x) for x in comm.allgather(noisy.tobytes())}) == 1,
          "all-reduce results are bit-identical on every rank")
    arr = np.full((3, 4), float(r), dtype=np.float32)
    got = comm.broadcast(arr, root=n - 1)
    check(got is arr and np.all(arr == n - 1), "broadcast array in place")
    obj = comm.broadcast({"from": r, "list": [1, 2]} if r == 0 else None, root=0)
    check(obj == {"from": 0, "list": [1, 2]}, "broadcast object")
    check(comm.allgather(r * 10) == [i * 10 for i in range(n)], "allgather")
    check(comm.any_true([r == n - 1, False]) == [True, False], "any_true")
    # the two halves of an all-reduce, on a duplicate while this thread agrees on a flag
    dup = comm.duplicate()
    halves = np.arange(1001, dtype=np.float32) * (r + 1)  # blocks of unequal sizes
    t = threading.Thread(target=lambda: (dup.reduce_scatter_sum(halves),
                                         dup.allgather_blocks(halves)))
    t.start()
    check(comm.any_true([r == 0]) == [True], "any_true beside the duplicate's collectives")
    t.join(30)
    check(np.array_equal(halves, np.arange(1001, dtype=np.float32) * (n * (n + 1) / 2)),
          "reduce_scatter_sum then allgather_blocks")
    comm.barrier()


def case_gil(comm, args):
    """Rank 1 joins the all-reduce 1 s late; meanwhile rank 0's comm thread is blocked in it and
    rank 0's main thread counts Python loop turns. If MPI held the GIL the count would be ~0."""
    def spin(seconds):
        n, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            n += 1
        return n

    comm.barrier()
    baseline = spin(0.5) / 0.5
    buf = np.ones(1 << 20, dtype=np.float32)
    comm.barrier()
    if comm.rank == 0:
        done = threading.Event()
        t = threading.Thread(target=lambda: (comm.allreduce_sum(buf), done.set()))
        t.start()
        time.sleep(0.05)  # the thread is inside MPI_Allreduce now
        during = spin(0.6) / 0.6
        check(not done.is_set(), "the all-reduce waited for the late rank")
        t.join(30)
        print("RESULT " + json.dumps({"baseline_loops_per_s": baseline,
                                      "during_allreduce_loops_per_s": during,
                                      "ratio": during / baseline}), flush=True)
    else:
        time.sleep(1.0)
        comm.allreduce_sum(buf)


def recording_hook(net, ex, before):
    """A backward hook that keeps a copy of layer k's local diffs, then notifies `ex`."""
    def hook(k):
        before.append([net.learnable_params[i].diff.copy()
                       for i in net.learnable_layers[k - 1].param_ids])
        ex.on_learnable_done(k)
    return hook


def case_executor(comm, args):
    """Every plan on a fake net: the reduced gradients are the mean over ranks (to float
    rounding), bit-identical on every rank, and the trace shows the planned groups in order."""
    for name, p in PLANS.items():
        net = FakeNet(rank=comm.rank, seed=1)
        tracer = Tracer(comm.rank)
        watchdog = Watchdog(comm, 30)
        with GradientExecutor.from_net(net, p, comm, timeout=30, tracer=tracer,
                                       watchdog=watchdog) as ex:
            for _ in range(3):
                before = []  # each layer's local diffs as the hook sees them, backward order
                net.backward(hook=recording_hook(net, ex, before))
                ex.wait()
                everyone = comm.allgather(before)
                for j, layer_diffs in enumerate(before):
                    for i in range(len(layer_diffs)):
                        mean = sum(np.float64(1) * e[j][i] for e in everyone) / comm.size
                        k = len(before) - j
                        got = net.learnable_params[net.learnable_layers[k - 1].param_ids[i]].diff
                        check(np.allclose(got, mean, rtol=1e-6, atol=1e-6), f"{name}: mean")
                digests = comm.allgather(b"".join(d.tobytes() for d in net.diffs()))
                check(len(set(digests)) == 1, f"{name}: bit-identical on every rank")
        watchdog.close()
        ar = [e["args"]["layers"] for e in tracer.events if e["cat"] == "allreduce"]
        check(ar == [list(g) for g in p.groups] * 3, f"{name}: groups in order: {ar}")


def case_faulty(comm, args):
    """Train a fake net; at iteration 3 rank `args.rank` fails as `args.fault` says."""
    timeout = args.timeout
    watchdog = Watchdog(comm, timeout)
    net = FakeNet(rank=comm.rank)
    inner_allreduce = comm.allreduce_sum
    calls = [0]

    def allreduce(buf):  # the fault inside the communication thread
        calls[0] += 1
        if args.fault == "raise-thread" and comm.rank == args.rank and calls[0] == 9:
            print(f"FAULT {args.fault} rank {comm.rank}", flush=True)
            raise RuntimeError("injected failure in the communication thread")
        inner_allreduce(buf)

    comm.allreduce_sum = allreduce
    ex = GradientExecutor.from_net(net, PLANS["wfbp"], comm, timeout=timeout,
                                   watchdog=watchdog)
    for it in range(1, 1000):
        if it == 3 and comm.rank == args.rank and args.fault != "raise-thread":
            print(f"FAULT {args.fault} rank {comm.rank}", flush=True)
            if args.fault == "raise-main":
                raise RuntimeError("injected failure in the main thread")
            if args.fault == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            if args.fault == "stall":
                time.sleep(3600)  # alive but stuck: only the watchdog can end the others
        net.backward(hook=ex.on_learnable_done)
        ex.wait()
        time.sleep(0.01)
        if comm.any_true([False])[0]:  # the per-iteration agreement, as training does
            break
    print(f"OK faulty rank {comm.rank} (no fault happened)", flush=True)


CASES = {"collectives": case_collectives, "gil": case_gil, "executor": case_executor,
         "faulty": case_faulty}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=sorted(CASES))
    parser.add_argument("--fault", default="none")
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--wait", default="poll", choices=["poll", "block"])
    args = parser.parse_args()
    comm, rank, size = world(mpi_wait=args.wait)
    try:
        CASES[args.case](comm, args)
    except BaseException as exc:  # noqa: BLE001 - every rank must end, not only this one
        fail_all(comm, exc)
        raise
    print(f"OK {args.case} rank {rank}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
