"""LMDB reading: key order, wrap-around, Caffe 1.0's k % N == rank sharding, errors."""

from __future__ import annotations

import os

import lmdb
import pytest

from mgcaffe.data.convert import write_lmdb
from mgcaffe.data.db import LMDBReader, open_db
from mgcaffe.errors import DataError
from mgcaffe.proto import caffe_pb2


def make_db(path, keys):
    write_lmdb(path, (k.encode() for k in keys), keys=keys)  # value = key, for checking
    return str(path)


def read_keys(reader, n):
    return [reader.next()[0].decode() for _ in range(n)]


def test_key_order_not_insertion_order(tmp_path):
    db = make_db(tmp_path / "db", ["c", "a", "b"])
    reader = LMDBReader(db)
    assert len(reader) == 3
    assert reader.first() == (b"a", b"a")
    assert read_keys(reader, 3) == ["a", "b", "c"]


def test_wraps_around(tmp_path):
    keys = [f"{i:03d}" for i in range(5)]
    reader = LMDBReader(make_db(tmp_path / "db", keys))
    assert read_keys(reader, 12) == (keys * 3)[:12]


def test_skip_is_applied_before_counting(tmp_path):
    keys = [f"{i:03d}" for i in range(5)]
    reader = LMDBReader(make_db(tmp_path / "db", keys), skip=7)
    assert read_keys(reader, 4) == ["002", "003", "004", "000"]


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_sharded_ranks_together_read_one_big_batch(tmp_path, world_size):
    keys = [f"{i:04d}" for i in range(7)]  # 7 is prime to N: batches straddle the wrap
    db = make_db(tmp_path / "db", keys)
    batch = 3
    single = LMDBReader(db)
    ranks = [LMDBReader(db, rank=r, world_size=world_size) for r in range(world_size)]
    for _ in range(5):
        big = read_keys(single, world_size * batch)
        per_rank = [read_keys(reader, batch) for reader in ranks]
        interleaved = [per_rank[r][i] for i in range(batch) for r in range(world_size)]
        assert interleaved == big


def test_missing_db_names_path(tmp_path):
    missing = tmp_path / "nope_lmdb"
    with pytest.raises(DataError, match="nope_lmdb.*not found"):
        LMDBReader(missing)


def test_not_a_database_of_the_backend_asked_for(tmp_path):
    # (LevelDB sources themselves: tests/data/test_leveldb.py)
    with pytest.raises(DataError, match="LevelDB .* has no CURRENT file"):
        open_db(tmp_path, caffe_pb2.DataParameter.LEVELDB)
    fake = tmp_path / "ldb"
    fake.mkdir()
    (fake / "CURRENT").write_text("MANIFEST-000001\n")
    with pytest.raises(DataError, match="is a LEVELDB database, but backend LMDB"):
        LMDBReader(fake)
    with pytest.raises(DataError, match="LevelDB .*ldb': cannot open"):  # no manifest
        open_db(fake)


def test_empty_db_and_bad_rank(tmp_path):
    lmdb.open(str(tmp_path / "empty")).close()
    with pytest.raises(DataError, match="no records"):
        LMDBReader(tmp_path / "empty")
    db = make_db(tmp_path / "db", ["a"])
    with pytest.raises(DataError, match="rank 2"):
        LMDBReader(db, rank=2, world_size=2)


def test_write_lmdb_refuses_to_overwrite(tmp_path):
    db = make_db(tmp_path / "db", ["a"])
    with pytest.raises(DataError, match="already exists"):
        write_lmdb(db, [b"x"])
    write_lmdb(db, [b"x", b"y"], overwrite=True, chunk=1)
    assert read_keys(LMDBReader(db), 2) == ["00000000", "00000001"]


TRUNCATED_READER = """
import sys
from mgcaffe.data.db import LMDBReader
from mgcaffe.errors import DataError
try:
    reader = LMDBReader(sys.argv[1])
    for _ in range(len(reader)):
        reader.next()
except DataError as exc:
    print(exc)
    sys.exit(3)
"""


@pytest.mark.parametrize("keep", [0, 2 * 4096, 0.5, -1])
def test_truncated_data_file_is_named_not_a_sigbus(tmp_path, keep):
    """A data.mdb cut short (an interrupted copy) is refused before a page past its end is
    touched (which is a SIGBUS); the reader runs in a child so a crash cannot take pytest."""
    import subprocess
    import sys

    path = tmp_path / "db"
    env = lmdb.open(str(path), map_size=1 << 24)
    with env.begin(write=True) as txn:
        for i in range(300):
            txn.put(b"%06d" % i, bytes(1000))
    env.close()
    data = path / "data.mdb"
    full = data.stat().st_size
    size = {0.5: full // 2, -1: full - 1}.get(keep, keep)
    os.truncate(data, size)
    result = subprocess.run([sys.executable, "-c", TRUNCATED_READER, str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 3, (result.returncode, result.stderr[-500:])
    line = result.stdout.strip()
    assert str(data) in line and "\n" not in line
    assert ("empty" if size == 0 else "truncated") in line
