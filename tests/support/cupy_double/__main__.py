"""`python -m cupy_double [--devices N] [--counts FILE] (-m MODULE | SCRIPT)
ARGS...`: run a program with the CuPy double installed (tests start `mgcaffe` commands and
MPI ranks this way); with --counts, the counters are written to FILE as JSON at exit
(FILE may contain {rank}: the MPI rank from the launcher's environment, `main` in a process
no launcher started, such as `mgcaffe train --gpu 0,1`, which starts its ranks itself)."""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys

from . import install


def _rank() -> str:
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if name in os.environ:
            return os.environ[name]
    return "main"


def main() -> None:
    args = sys.argv[1:]
    devices, counts = 1, None
    while args and args[0] in ("--devices", "--counts"):
        if args[0] == "--devices":
            devices = int(args[1])
        else:
            counts = args[1]
        args = args[2:]
    if not args:
        raise SystemExit(__doc__)
    double = install(devices)
    if counts is not None:
        def write():
            c = double.counters
            data = {**c.totals(), "contexts": sorted(c.contexts),
                    "sync_sites": dict(c.sync_sites),
                    "launches_by_stream": dict(c.launches_by_stream)}
            with open(counts.format(rank=_rank()), "w") as f:
                json.dump(data, f, indent=1)
        atexit.register(write)
    if args[0] == "-m":
        sys.argv = [args[1]] + args[2:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = args
        runpy.run_path(args[0], run_name="__main__")


main()
