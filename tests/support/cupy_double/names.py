"""The public names CuPy really has, so that the double offers those and no others.

Read from CuPy's own modules when CuPy is installed (`real_names()`), else from the list
checked in beside this file (`names.json`, written by `python -m
cupy_double.names --write` on a machine with CuPy; importing CuPy needs no
GPU). Names that only exist on an instance or on a CuPy build with NCCL cannot be read
without a GPU; `INSTANCE_NAMES` lists those from CuPy's documentation.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import warnings
from functools import cache
from pathlib import Path

__all__ = ["INSTANCE_NAMES", "cupy_names", "real_names"]

LIST = Path(__file__).with_name("names.json")

#: module or class -> where to read it in a real CuPy
_SOURCES = {
    "cupy": ("cupy", None),
    "cupy.cuda": ("cupy.cuda", None),
    "cupy.cuda.runtime": ("cupy.cuda.runtime", None),
    "cupy.random": ("cupy.random", None),
    "cupy.lib.stride_tricks": ("cupy.lib.stride_tricks", None),
    "cupyx": ("cupyx", None),
    "cupy.ndarray": ("cupy", "ndarray"),
    "cupy.ufunc": ("cupy", "add"),
    "cupy.cuda.Stream": ("cupy.cuda", "Stream"),
    "cupy.cuda.Event": ("cupy.cuda", "Event"),
    "cupy.cuda.Device": ("cupy.cuda", "Device"),
    "cupy.cuda.MemoryPointer": ("cupy.cuda", "MemoryPointer"),
    "cupy.RawKernel": ("cupy", "RawKernel"),
}

#: Attributes set on instances (Cython `readonly` fields) and the NCCL bindings, which a
#: CuPy without NCCL does not define: from CuPy's API reference.
INSTANCE_NAMES = {
    "cupy.cuda.Stream": ["ptr", "device_id", "null"],
    "cupy.cuda.Event": ["ptr"],
    "cupy.cuda.nccl": ["NcclCommunicator", "NcclError", "get_unique_id", "get_version",
                       "NCCL_FLOAT16", "NCCL_FLOAT32", "NCCL_FLOAT64", "NCCL_SUM", "available"],
    "cupy.cuda.nccl.NcclCommunicator": ["allReduce", "reduceScatter", "allGather", "bcast",
                                        "abort", "destroy",
                                        "check_async_error", "rank_id", "size", "device_id"],
}


def real_names() -> dict[str, list[str]]:
    """Every public name of the modules and classes the double stands in for, read from the
    CuPy installed here (an ImportError when there is none)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CuPy warns when it finds no CUDA driver
        out = {}
        for key, (module, attribute) in _SOURCES.items():
            obj = importlib.import_module(module)
            if attribute is not None:
                obj = getattr(obj, attribute)
            out[key] = sorted(n for n in dir(obj) if not n.startswith("_"))
        out["version"] = [importlib.import_module("cupy").__version__]
    return out


@cache
def cupy_names() -> dict[str, frozenset[str]]:
    """The names by module/class: from CuPy when it is importable, else the checked-in list;
    `INSTANCE_NAMES` added."""
    source = None
    if importlib.util.find_spec("cupy") is not None and "cupy" not in sys.modules:
        try:
            source = real_names()
        except Exception:  # noqa: BLE001 - a broken CuPy install: the list still serves
            source = None
    if source is None:
        source = json.loads(LIST.read_text())
    names = {key: frozenset(value) for key, value in source.items()}
    for key, extra in INSTANCE_NAMES.items():
        names[key] = names.get(key, frozenset()) | frozenset(extra)
    return names


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="write names.json from the installed CuPy")
    parser.add_argument("--write", action="store_true", help=f"write {LIST}")
    args = parser.parse_args(argv)
    names = real_names()
    text = json.dumps(names, indent=0, sort_keys=True) + "\n"
    if args.write:
        LIST.write_text(text)
    print(f"CuPy {names['version'][0]}: " + ", ".join(f"{k} {len(v)}" for k, v in names.items()
                                                    if k != "version"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
