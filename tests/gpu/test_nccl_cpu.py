"""The NCCL communicator's host-side parts, without a GPU: GPU choice per node-local rank,
node-local ranks over a thread world, the polling wait with its deadline, and the one-line
error when CuPy is missing."""

from __future__ import annotations

import threading

import pytest

from mgcaffe.backend import gpu_available
from mgcaffe.comm.backends import nccl
from mgcaffe.comm.backends.local import LocalWorld, SingleCommunicator
from mgcaffe.errors import CommError


def test_module_imports_without_cupy():
    assert nccl.NcclCommunicator.name == "nccl"
    assert nccl.NcclCommunicator.device_streams is True


@pytest.mark.parametrize("local_rank, local_size, count, devices, expected", [
    (0, 1, 1, None, 0),
    (3, 8, 8, None, 3),
    (1, 2, 4, [2, 3], 3),
    (0, 2, 2, (1, 0), 1),
])
def test_select_gpu_takes_the_local_ranks_device(local_rank, local_size, count, devices,
                                                 expected):
    assert nccl.select_gpu(local_rank, local_size, count, devices) == expected


@pytest.mark.parametrize("local_size, count, devices, message", [
    (1, 0, None, "rank 5: no CUDA device is visible"),
    (3, 2, None, "rank 5: 3 ranks on this node but 2 GPU\\(s\\) \\[0, 1\\].*at most 2 ranks"),
    (1, 2, [2], "rank 5: GPU ids \\[2\\] do not exist; 2 visible"),
    (2, 4, [1, 1], "rank 5: GPU ids \\[1, 1\\] repeat"),
])
def test_select_gpu_errors_name_the_rank_and_the_remedy(local_size, count, devices, message):
    with pytest.raises(CommError, match=message):
        nccl.select_gpu(0, local_size, count, devices, rank=5)


def test_node_local_rank_of_a_single_process():
    assert nccl.node_local_rank(SingleCommunicator()) == (0, 1)


def test_node_local_rank_over_a_thread_world_on_one_host():
    world = LocalWorld(3, timeout=10)
    results = {}

    def run(comm):
        results[comm.rank] = nccl.node_local_rank(comm)

    threads = [threading.Thread(target=run, args=(c,)) for c in world.communicators()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert results == {0: (0, 3), 1: (1, 3), 2: (2, 3)}


def test_poll_until_done_returns_once_done_and_checks_between_polls():
    state = {"polls": 0, "checks": 0}

    def is_done():
        state["polls"] += 1
        return state["polls"] > 3

    def check():
        state["checks"] += 1

    nccl.poll_until_done(is_done, check, 5.0, lambda: AssertionError("no timeout expected"))
    assert state["polls"] == 4
    assert state["checks"] == 4  # 3 between polls, 1 after completion


def test_poll_until_done_raises_the_checks_error():
    def check():
        raise CommError("rank 0 (GPU 0): NCCL all-reduce failed: remote error")

    with pytest.raises(CommError, match="remote error"):
        nccl.poll_until_done(lambda: False, check, 5.0, lambda: AssertionError("no timeout"))


def test_poll_until_done_gives_up_after_the_deadline():
    cleaned = []

    def on_timeout():
        cleaned.append(True)
        return CommError("rank 2 (GPU 1): all-reduce of group 3 not done after 0.05 s")

    with pytest.raises(CommError, match="group 3 not done after 0.05 s"):
        nccl.poll_until_done(lambda: False, lambda: None, 0.05, on_timeout)
    assert cleaned == [True]


@pytest.mark.skipif(gpu_available(), reason="checks the error on a machine without CuPy/GPU")
def test_constructing_without_cupy_is_a_one_line_comm_error():
    with pytest.raises(CommError) as info:
        nccl.NcclCommunicator(SingleCommunicator())
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("rank 0: the NCCL backend needs CuPy and a CUDA GPU")
    assert "pip install mgcaffe[gpu]" in message


A, B, C = "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"


@pytest.mark.parametrize("views, expected", [
    ([[A], [B]], [0, 0]),                  # one GPU per rank (Slurm --gpus-per-task=1)
    ([[A, B], [B, A]], [0, 0]),            # both see both, in another order: B for rank 1
    ([[A, B, C], [B, C], [C]], [0, 0, 0]),  # nested bindings
    ([[A, B], [A, B]], [0, 1]),            # every rank sees every GPU: by local rank
])
def test_select_gpu_honours_what_the_launcher_gave_each_rank(views, expected):
    got = [nccl.select_gpu(r, len(views), len(views[r]), None, r, views)
           for r in range(len(views))]
    assert got == expected
    chosen = [views[r][g] for r, g in enumerate(got)]
    assert len(set(chosen)) == len(chosen)  # one physical GPU per rank


def test_ranks_left_to_share_a_gpu_are_named():
    with pytest.raises(CommError, match="rank 1: local ranks 0 and 1 of this node would "
                                        "share GPU 0000:01:00.0"):
        nccl.select_gpu(1, 2, 1, None, 1, [[A, B], [A]])
    with pytest.raises(CommError, match="2 ranks on this node but 1 GPU"):
        nccl.select_gpu(1, 2, 1, None, 1, [[A], [A]])  # both see the one GPU: too many ranks


def test_one_gpu_per_rank_through_cuda_visible_devices(monkeypatch):
    """Each rank of a thread world sees its own GPU through CUDA_VISIBLE_DEVICES."""
    import cupy_double

    world = LocalWorld(2, timeout=10)
    results = {}
    with cupy_double.installed(devices=2) as double:
        double.state._visible = 1  # each "process" sees one GPU ...
        physical = {0: 0, 1: 1}
        double.state.physical_id = lambda ordinal, r=None: physical[
            int(threading.current_thread().name[-1])]  # ... rank r's GPU r

        def run(comm):
            results[comm.rank] = nccl.local_gpu(comm)

        threads = [threading.Thread(target=run, args=(c,), name=f"rank{c.rank}")
                   for c in world.communicators()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
    assert results == {0: (0, 0, 2), 1: (0, 1, 2)}
