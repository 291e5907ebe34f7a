"""Compressed all-reduces over MPI (run by tests/comm/test_compress_mpi.py):

    mpiexec -n 2 python tests/mpi/wire_checks.py

Each rank sums payloads of 1001 values (uneven blocks) in float16 (the library's
MPI_FLOAT16_T sum, and the all-to-all + host sum) and bfloat16 (no MPI type: all-to-all +
host sum), whole and in halves, in one all-to-all round and in several, and compares them
with the correctly rounded sum of the two ranks' values computed here in numpy; prints
`OK rank R`."""

from __future__ import annotations

import numpy as np

from mgcaffe.comm.backends import mpi
from mgcaffe.comm.backends.mpi import HALF_SUMS, MpiCommunicator


def payloads(size: int, n: int = 1001) -> list[np.ndarray]:
    return [np.random.default_rng(r).standard_normal(n).astype(np.float32) for r in range(size)]


def rounded(fmt: str, x: np.ndarray) -> np.ndarray:
    if fmt == "float16":
        return x.astype(np.float16).astype(np.float32)
    m, e = np.frexp(x.astype(np.float64))
    return np.ldexp(np.rint(m * 256.0) / 256.0, e).astype(np.float32)


def bits(fmt: str, x: np.ndarray) -> np.ndarray:
    """float32 values exact in `fmt` as its payload."""
    if fmt == "float16":
        return x.astype(np.float16)
    return (x.view(np.uint32) >> 16).astype(np.uint16)


def values(fmt: str, p: np.ndarray) -> np.ndarray:
    if fmt == "float16":
        return p.astype(np.float32)
    return (p.astype(np.uint32) << 16).view(np.float32)


def main() -> None:
    for rounds in (mpi.A2A_WORDS, 97):  # one all-to-all round, and several (uneven) ones
        mpi.A2A_WORDS = rounds
        check()


def check() -> None:
    for half_sum in HALF_SUMS:
        comm = MpiCommunicator(half_sum=half_sum)
        mine = [rounded(f, x) for f in ("float16", "bfloat16") for x in payloads(comm.size)]
        for i, fmt in enumerate(("float16", "bfloat16")):
            own = mine[i * comm.size:(i + 1) * comm.size]
            want = rounded(fmt, sum(own[1:], own[0]))  # two ranks: exact float32 sum
            for halves in (False, True):
                buf = bits(fmt, own[comm.rank])
                if halves:
                    comm.reduce_scatter_wire(buf, fmt)
                    comm.allgather_wire(buf, fmt)
                else:
                    comm.allreduce_wire(buf, fmt)
                got = values(fmt, buf)
                if not np.array_equal(got, want):
                    bad = int(np.flatnonzero(got != want)[0])
                    raise SystemExit(f"rank {comm.rank}: {half_sum} {fmt} halves={halves}: "
                                     f"element {bad} is {got[bad]}, want {want[bad]}")
    print(f"OK rank {comm.rank}", flush=True)


if __name__ == "__main__":
    main()
