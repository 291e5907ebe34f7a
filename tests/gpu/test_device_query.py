"""`mgcaffe device_query`: Caffe's lines from a property dict, --gpu parsing, and the one-line
error (exit status 1) on a machine without CuPy or a GPU."""

from __future__ import annotations

import pytest

from mgcaffe.backend import gpu_available
from mgcaffe.cli import main
from mgcaffe.commands import device_query
from mgcaffe.errors import MgcaffeError

H200 = {
    "name": b"NVIDIA H200", "major": 9, "minor": 0, "totalGlobalMem": 150_000_000_000,
    "sharedMemPerBlock": 49152, "regsPerBlock": 65536, "warpSize": 32,
    "memPitch": 2147483647, "maxThreadsPerBlock": 1024, "maxThreadsDim": (1024, 1024, 64),
    "maxGridSize": (2147483647, 65535, 65535), "clockRate": 1980000,
    "totalConstMem": 65536, "textureAlignment": 512, "deviceOverlap": 1,
    "multiProcessorCount": 132, "kernelExecTimeoutEnabled": 0,
}


def test_lines_follow_caffe_labels_and_alignment():
    lines = device_query.device_lines(0, H200)
    assert lines[0] == "Device id:                     0"
    assert "Major revision number:         9" in lines
    assert "Name:                          NVIDIA H200" in lines
    assert "Total global memory:           150000000000" in lines
    assert "Maximum dimension of block:    1024, 1024, 64" in lines
    assert "Concurrent copy and execution: Yes" in lines
    assert "Kernel execution timeout:      No" in lines
    assert len({line.index(line.split(":", 1)[1].strip()) for line in lines}) == 1


def test_properties_a_newer_cuda_dropped_show_as_na():
    props = {k: v for k, v in H200.items() if k not in ("clockRate", "deviceOverlap")}
    lines = device_query.device_lines(1, props)
    assert "Clock rate:                    n/a" in lines
    assert "Concurrent copy and execution: n/a" in lines


@pytest.mark.parametrize("flag, count, expected", [
    ("all", 3, [0, 1, 2]), ("1", 2, [1]), ("0,2", 4, [0, 2]), ("ALL", 1, [0]),
])
def test_gpu_flag(flag, count, expected):
    assert device_query.parse_gpu_ids(flag, count) == expected


@pytest.mark.parametrize("flag, message", [("3", "no such GPU; 2 visible"),
                                           ("x", "expected a device id")])
def test_gpu_flag_errors(flag, message):
    with pytest.raises(MgcaffeError, match=message):
        device_query.parse_gpu_ids(flag, 2)


@pytest.mark.skipif(gpu_available(), reason="checks the error on a machine without CuPy/GPU")
def test_without_a_gpu_one_line_error_and_exit_1(capsys):
    assert main(["device_query", "--gpu", "0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("mgcaffe device_query: error: ")
    assert "CuPy" in err[0] or "CUDA device" in err[0]


def test_run_logs_caffes_lines_for_each_device(monkeypatch, capsys):
    class Runtime:
        @staticmethod
        def getDeviceCount():
            return 2

        @staticmethod
        def getDeviceProperties(i):
            return dict(H200, name=f"GPU{i}".encode())

    class FakeCupy:
        class cuda:
            runtime = Runtime

    monkeypatch.setattr(device_query, "_import_cupy", lambda: FakeCupy)
    assert main(["device_query"]) == 0
    text = capsys.readouterr().err  # the CLI logs glog lines to stderr
    assert "Querying GPUs 0" in text and "Querying GPUs 1" in text
    assert "Name:                          GPU1" in text
    assert text.count("Total global memory:") == 2


@pytest.mark.gpu
def test_on_a_gpu_logs_every_line(capsys):
    assert main(["device_query", "--gpu", "0"]) == 0
    text = capsys.readouterr().err
    for label in ("Device id:", "Major revision number:", "Total global memory:",
                  "Number of multiprocessors:"):
        assert label in text
