"""`mgcaffe device_query`: show a GPU's properties, as Caffe's `caffe device_query` does.

    mgcaffe device_query [--gpu ID[,ID...]|all]      (default: every visible GPU)

Logs Caffe's lines (`Device id:`, `Major revision number:`, `Total global memory:`, ...) from
`cupy.cuda.runtime.getDeviceProperties`; a property the CUDA runtime no longer reports
(clockRate, deviceOverlap and kernelExecTimeoutEnabled left cudaDeviceProp in CUDA 13) shows
as `n/a`. Without CuPy or a GPU the command fails with a one-line error (exit status 1).
"""

from __future__ import annotations

import logging

from ..backend import _import_cupy
from ..errors import MgcaffeError

NAME = "device_query"
HELP = "show the properties of a GPU (Caffe's `caffe device_query`)"

log = logging.getLogger(__name__)

#: (label, property key, formatter) in Caffe's order; labels padded as Caffe pads them.
_LINES = [
    ("Major revision number", "major", None),
    ("Minor revision number", "minor", None),
    ("Name", "name", None),
    ("Total global memory", "totalGlobalMem", None),
    ("Total shared memory per block", "sharedMemPerBlock", None),
    ("Total registers per block", "regsPerBlock", None),
    ("Warp size", "warpSize", None),
    ("Maximum memory pitch", "memPitch", None),
    ("Maximum threads per block", "maxThreadsPerBlock", None),
    ("Maximum dimension of block", "maxThreadsDim", "triple"),
    ("Maximum dimension of grid", "maxGridSize", "triple"),
    ("Clock rate", "clockRate", None),
    ("Total constant memory", "totalConstMem", None),
    ("Texture alignment", "textureAlignment", None),
    ("Concurrent copy and execution", "deviceOverlap", "yes_no"),
    ("Number of multiprocessors", "multiProcessorCount", None),
    ("Kernel execution timeout", "kernelExecTimeoutEnabled", "yes_no"),
]
_WIDTH = len("Total shared memory per block: ")


def add_arguments(parser) -> None:
    parser.add_argument("--gpu", default="all", metavar="ID|all",
                        help="the GPU to query, a comma-separated list, or `all` (default)")


def _format(value, kind) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bytes):
        value = value.decode(errors="replace").rstrip("\0")
    if kind == "triple":
        return ", ".join(str(v) for v in list(value)[:3])
    if kind == "yes_no":
        return "Yes" if value else "No"
    return str(value)


def device_lines(device_id: int, props: dict) -> list[str]:
    """Caffe's device_query lines for one device's property dictionary."""
    lines = [f"{'Device id:':<{_WIDTH}}{device_id}"]
    for label, key, kind in _LINES:
        lines.append(f"{label + ':':<{_WIDTH}}{_format(props.get(key), kind)}")
    return lines


def parse_gpu_ids(flag: str, count: int) -> list[int]:
    """`all` or `ID[,ID...]` -> the device ids, each checked against the `count` visible."""
    if flag.strip().lower() == "all":
        return list(range(count))
    try:
        ids = [int(part) for part in flag.split(",") if part.strip()]
    except ValueError:
        raise MgcaffeError(f"--gpu: expected a device id, a comma-separated list or `all`, "
                           f"got {flag!r}") from None
    bad = [i for i in ids if not 0 <= i < count]
    if not ids or bad:
        raise MgcaffeError(f"--gpu {flag}: no such GPU; {count} visible (ids 0..{count - 1})")
    return ids


def _device_count(cupy) -> int:
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # noqa: BLE001 - CUDA reports "no device" / "no driver" this way
        raise MgcaffeError(f"no usable CUDA device: {exc}") from None


def run(args) -> int:
    cupy = _import_cupy()  # a one-line MgcaffeError (exit 1) when CuPy is missing
    count = _device_count(cupy)
    if count == 0:
        raise MgcaffeError("no CUDA device is visible (check the driver and "
                           "CUDA_VISIBLE_DEVICES)")
    for device_id in parse_gpu_ids(args.gpu, count):
        log.info("Querying GPUs %d", device_id)
        props = cupy.cuda.runtime.getDeviceProperties(device_id)
        for line in device_lines(device_id, props):
            log.info("%s", line)
    return 0
