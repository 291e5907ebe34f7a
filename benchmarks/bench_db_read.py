"""LevelDB against LMDB: records read per second through the Data layer's reader (DBReader),
on the same records, side by side.

    python benchmarks/bench_db_read.py [--records 20000] [--shape 3,32,32] [--repeat 3]

Writes one LMDB and one LevelDB of the same random uint8 Datums in a temporary directory,
then times, alternating the two backends and keeping the best of `--repeat` runs:
- one reader reading every record once (a pass, as one rank of one);
- two ranks of two, one reader each, reading their halves at once: as threads of one
  process for both backends (LevelDB allows one process, so that is how two ranks can
  share one), and as two processes for LMDB.
The rate is records delivered per second, all readers together, from the moment every
reader is open (opening a database is timed apart). Decoding and transforms are not
included: this is the database's share of the Data layer's work.
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from mgcaffe.data.convert import write_records
from mgcaffe.data.datum import array_to_datum
from mgcaffe.data.db import DBReader
from mgcaffe.proto import caffe_pb2

BACKENDS = {"LMDB": caffe_pb2.DataParameter.LMDB, "LevelDB": caffe_pb2.DataParameter.LEVELDB}


def write(root: Path, records: int, shape: tuple[int, ...]) -> dict[str, str]:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=shape, dtype=np.uint8)
    values = [array_to_datum(image, label=i % 10).SerializeToString() for i in range(records)]
    paths = {}
    for name, backend in BACKENDS.items():
        path = root / name
        write_records(path, ((f"{i:08d}", v) for i, v in enumerate(values)), backend=backend)
        paths[name] = str(path)
    return paths


def read_share(path: str, rank: int, world_size: int, count: int, barrier=None,
               out=None) -> float:
    """Open a reader, wait for the others, read `count` records: the seconds reading took
    (opening not counted; `out` gets them too, from another process)."""
    reader = DBReader(path, rank=rank, world_size=world_size)
    try:
        if barrier is not None:
            barrier.wait()
        t0 = time.perf_counter()
        for _ in range(count):
            reader.next()
        seconds = time.perf_counter() - t0
    finally:
        reader.close()
    if out is not None:
        out.put(seconds)
    return seconds


def one_reader(path: str, records: int) -> float:
    return records / read_share(path, 0, 1, records)


def two_threads(path: str, records: int) -> float:
    barrier, seconds = threading.Barrier(2), []
    threads = [threading.Thread(target=lambda r=r: seconds.append(
        read_share(path, r, 2, records // 2, barrier))) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 2 * (records // 2) / max(seconds)


def two_processes(path: str, records: int) -> float:
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=read_share, args=(path, r, 2, records // 2, barrier, out))
             for r in range(2)]
    for p in procs:
        p.start()
    seconds = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        if p.exitcode != 0:
            raise RuntimeError(f"reader process exited {p.exitcode}")
    return 2 * (records // 2) / max(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--shape", default="3,32,32")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    shape = tuple(int(d) for d in args.shape.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        paths = write(Path(tmp), args.records, shape)
        for name, path in paths.items():  # the first open of a LevelDB replays its log
            t0 = time.perf_counter()
            DBReader(path).close()
            print(f"first open of the {name}: {time.perf_counter() - t0:.3f} s")
        cases = [("1 reader", one_reader, ("LMDB", "LevelDB")),
                 ("2 ranks as threads", two_threads, ("LMDB", "LevelDB")),
                 ("2 ranks as processes", two_processes, ("LMDB",))]
        print(f"{args.records} records of {'x'.join(map(str, shape))} uint8 "
              f"({np.prod(shape)} bytes each); best of {args.repeat}, records/s")
        print(f"{'case':24s} {'LMDB':>10s} {'LevelDB':>10s} {'LevelDB/LMDB':>13s}")
        for label, fn, backends in cases:
            best = {name: 0.0 for name in backends}
            for _ in range(args.repeat):
                for name in backends:  # alternated, so a change in load hits both
                    best[name] = max(best[name], fn(paths[name], args.records))
            ldb = best.get("LevelDB")
            ratio = f"{ldb / best['LMDB']:13.2f}" if ldb else f"{'(one process)':>13s}"
            print(f"{label:24s} {best['LMDB']:10.0f} "
                  f"{(f'{ldb:10.0f}' if ldb else '         -')} {ratio}")


if __name__ == "__main__":
    main()
