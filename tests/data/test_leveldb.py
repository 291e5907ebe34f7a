"""LevelDB sources, read as Caffe's Data layer reads them and checked against LMDB.

The LevelDB is written here with plyvel directly (as any LevelDB tool would write it), the
LMDB with the lmdb library, both holding the same records; everything the Data layer does
with the LMDB (key order, wrap-around, k % N == rank sharding, transforms, exact resume)
must come out batch for batch the same from the LevelDB.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import lmdb
import numpy as np
import pytest

from mgcaffe.data.convert import write_records
from mgcaffe.data.datum import array_to_datum
from mgcaffe.data.db import DBReader, open_db
from mgcaffe.errors import DataError, NetError
from mgcaffe.formats.protoio import parse_net_text
from mgcaffe.net import Net
from mgcaffe.proto import caffe_pb2

plyvel = pytest.importorskip("plyvel", reason="LevelDB needs plyvel (a runtime dependency)")

RECORDS = 23  # prime to every batch and world size used: batches straddle the wrap
LEVELDB = caffe_pb2.DataParameter.LEVELDB
LMDB = caffe_pb2.DataParameter.LMDB


def _records():
    rng = np.random.default_rng(11)
    images = rng.integers(0, 256, size=(RECORDS, 2, 5, 6), dtype=np.uint8)
    # keys not in writing order: both databases must read them in key order
    keys = [f"{(i * 7) % RECORDS:05d}_img{i}".encode() for i in range(RECORDS)]
    return [(key, array_to_datum(im, label=i).SerializeToString())
            for i, (key, im) in enumerate(zip(keys, images))]


@pytest.fixture(scope="module")
def dbs(tmp_path_factory):
    """(LevelDB path, LMDB path) of the same records."""
    root = tmp_path_factory.mktemp("dbs")
    records = _records()
    db = plyvel.DB(str(root / "ldb"), create_if_missing=True)
    with db.write_batch() as batch:
        for key, value in records:
            batch.put(key, value)
    db.close()
    env = lmdb.open(str(root / "lmdb"), map_size=1 << 24)
    with env.begin(write=True) as txn:
        for key, value in records:
            txn.put(key, value)
    env.close()
    return str(root / "ldb"), str(root / "lmdb")


def read(reader, n):
    return [reader.next() for _ in range(n)]


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_reader_reads_the_lmdb_records_rank_for_rank(dbs, world_size):
    ldb, mdb = dbs
    pairs = [(DBReader(ldb, r, world_size), DBReader(mdb, r, world_size))
             for r in range(world_size)]
    try:
        assert pairs[0][0].kind == "LevelDB" and len(pairs[0][0]) == RECORDS
        for _ in range(4):  # past the wrap
            for a, b in pairs:
                assert read(a, 5) == read(b, 5)
    finally:
        for a, b in pairs:
            a.close()
            b.close()


def _net(source, batch, backend="", rank=0, world_size=1):
    text = f"""
    layer {{ name: "data" type: "Data" top: "data" top: "label"
      transform_param {{ mirror: true crop_size: 4 scale: 0.5 }}
      data_param {{ source: "{source}" batch_size: {batch} {backend} }} }}"""
    return Net(parse_net_text(text), caffe_pb2.TRAIN, seed=3, rank=rank,
               world_size=world_size)


def _batches(net, n):
    out = []
    for _ in range(n):
        net.forward()
        out.append((net.blobs["data"].data.copy(), net.blobs["label"].data.copy()))
    return out


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("backend", ["", "backend: LEVELDB"], ids=["detected", "named"])
def test_data_layer_batches_equal_lmdb_over_ranks(dbs, world_size, backend):
    # Ranks as threads do it, in one process: the ranks' readers share one open LevelDB.
    ldb, mdb = dbs
    nets = [(_net(ldb, 3, backend, r, world_size), _net(mdb, 3, "backend: LMDB", r,
                                                          world_size))
            for r in range(world_size)]
    try:
        labels = []
        for a, b in nets:
            got, want = _batches(a, 5), _batches(b, 5)
            for (x, y), (u, v) in zip(got, want):
                assert np.array_equal(x, u) and np.array_equal(y, v)
            labels.append([lab for _, batch in got for lab in batch])
        # together the ranks read each record once per pass, in key order
        order = sorted(range(RECORDS), key=lambda i: f"{(i * 7) % RECORDS:05d}")
        merged = [labels[r][i] for i in range(15) for r in range(world_size)]
        assert merged == [order[k % RECORDS] for k in range(15 * world_size)]
    finally:
        for a, b in nets:
            a.close()
            b.close()


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_resume_mid_epoch_continues_exactly(dbs, world_size):
    ldb, mdb = dbs
    for rank in range(world_size):
        straight = _net(ldb, 4, "", rank, world_size)
        _batches(straight, 2)  # mid-epoch: 8 of 23 records per rank's share
        position = straight.layers[0].data_position()
        expected = _batches(straight, 4)  # continues past the wrap
        resumed = _net(ldb, 4, "", rank, world_size)
        resumed.layers[0].set_data_position(position)
        lmdb_resumed = _net(mdb, 4, "backend: LMDB", rank, world_size)
        lmdb_resumed.layers[0].set_data_position(position)  # the same position, either way
        for (x, y), (u, v), (p, q) in zip(expected, _batches(resumed, 4),
                                          _batches(lmdb_resumed, 4)):
            assert np.array_equal(x, u) and np.array_equal(y, v)
            assert np.array_equal(x, p) and np.array_equal(y, q)
        for net in (straight, resumed, lmdb_resumed):
            net.close()


def test_solver_resume_from_a_snapshot_continues_the_leveldb(tmp_path, dbs):
    import mgcaffe

    ldb, _ = dbs
    (tmp_path / "net.prototxt").write_text(f"""
layer {{ name: "data" type: "Data" top: "data" top: "label"
  transform_param {{ mirror: true crop_size: 4 scale: 0.004 }}
  data_param {{ source: "{ldb}" batch_size: 4 }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param {{ num_output: {RECORDS} weight_filler {{ type: "gaussian" std: 0.1 }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}
""")

    def solver(prefix):
        path = tmp_path / f"{prefix}.prototxt"
        path.write_text(f'net: "{tmp_path}/net.prototxt"\nbase_lr: 0.1\nmomentum: 0.9\n'
                        f'lr_policy: "fixed"\ndisplay: 0\nmax_iter: 10\nrandom_seed: 7\n'
                        f'snapshot: 5\nsnapshot_prefix: "{tmp_path}/{prefix}"\n')
        return mgcaffe.get_solver(str(path))

    first = solver("a")
    first.solve()
    first.close()
    second = solver("b")
    second.restore(str(tmp_path / "a_iter_5.solverstate"))
    second.solve()
    second.close()
    a = mgcaffe.Net(str(tmp_path / "net.prototxt"), mgcaffe.TEST,
                    weights=str(tmp_path / "a_iter_10.caffemodel"))
    b = mgcaffe.Net(str(tmp_path / "net.prototxt"), mgcaffe.TEST,
                    weights=str(tmp_path / "b_iter_10.caffemodel"))
    assert np.array_equal(a.params["ip"][0].data, b.params["ip"][0].data)
    a.close()
    b.close()


HOLDER = textwrap.dedent("""
    import sys, plyvel
    db = plyvel.DB(sys.argv[1])
    print("holding", flush=True)
    sys.stdin.read()
    db.close()
""")


@pytest.fixture
def held(dbs):
    """The LevelDB held open by another process (as another training would hold it)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, dbs[0]], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "holding\n"
        yield dbs[0]
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def test_a_leveldb_held_by_another_process_is_one_line_naming_the_lock(held):
    with pytest.raises(DataError) as info:
        open_db(held)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"LevelDB {held!r} is open in another process: its lock "
                              f"{held}/LOCK is held")
    assert "one process open a database at a time; stop that process, or convert it" \
        in message
    assert f"mgcaffe convert_db {held} {held}_lmdb" in message
    with pytest.raises(DataError, match="each of this job's 2 ranks opens it"):
        open_db(held, rank=1, world_size=2)
    with pytest.raises(NetError, match=r"layer 'data' \(Data\): .* is open in another process"):
        _net(held, 2)


def test_train_and_test_nets_of_one_process_share_it(dbs):
    ldb, _ = dbs
    train, test = _net(ldb, 2), _net(ldb, 5)
    assert train.layers[0].reader._store._db is test.layers[0].reader._store._db
    _batches(train, 2)
    _batches(test, 2)
    train.close()
    test.close()
    plyvel.DB(ldb).close()  # closed with the last reader: another process may open it now


def test_backend_that_does_not_match_the_files(dbs):
    ldb, mdb = dbs
    with pytest.raises(DataError, match="is an LMDB database, but backend LEVELDB was asked"):
        open_db(mdb, LEVELDB)
    with pytest.raises(DataError, match="is a LEVELDB database, but backend LMDB was asked"):
        open_db(ldb, LMDB)


def test_missing_empty_and_not_a_database(tmp_path):
    with pytest.raises(DataError, match="'.*nope' not found"):
        open_db(tmp_path / "nope")
    with pytest.raises(DataError, match="LevelDB '.*nope' not found"):
        open_db(tmp_path / "nope", LEVELDB)
    plyvel.DB(str(tmp_path / "empty"), create_if_missing=True).close()
    with pytest.raises(DataError, match="LevelDB '.*empty' has no records"):
        open_db(tmp_path / "empty")
    (tmp_path / "plain").mkdir()
    with pytest.raises(DataError, match="neither an LMDB .* nor a LevelDB"):
        open_db(tmp_path / "plain")


def test_writer_writes_a_leveldb_whole_or_not_at_all(tmp_path):
    records = _records()
    assert write_records(tmp_path / "out", records, chunk=5, backend=LEVELDB) == RECORDS
    db = plyvel.DB(str(tmp_path / "out"))
    assert list(db) == sorted(records)
    db.close()
    with pytest.raises(DataError, match="LevelDB .* already exists"):
        write_records(tmp_path / "out", records, backend=LEVELDB)

    def broken():
        yield records[0]
        raise RuntimeError("disk gone")

    with pytest.raises(RuntimeError):
        write_records(tmp_path / "half", broken(), chunk=1, backend=LEVELDB)
    assert not (tmp_path / "half").exists()
    assert not list(tmp_path.glob("half.partial-*"))


def test_convert_db_copies_a_leveldb_into_an_lmdb_record_for_record(tmp_path, dbs):
    # what the lock error tells ranks on one node to do
    ldb, mdb = dbs
    out = tmp_path / "copy_lmdb"
    proc = subprocess.run([sys.executable, "-m", "mgcaffe", "convert_db", ldb, str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"Copied {RECORDS} records" in proc.stderr
    env = lmdb.open(str(out), readonly=True)
    with env.begin() as txn:
        assert list(txn.cursor()) == sorted(_records())
    env.close()
    back = tmp_path / "back_ldb"
    proc = subprocess.run([sys.executable, "-m", "mgcaffe", "convert_db", "-backend",
                           "leveldb", str(out), str(back)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    db = plyvel.DB(str(back))
    assert list(db) == sorted(_records())
    db.close()


@pytest.mark.slow
@pytest.mark.mpi
def test_ranks_on_one_node_are_refused_at_start_naming_the_lock(tmp_path, dbs):
    # Two rank processes cannot both open one LevelDB: the one that does not get the lock
    # says why and what to do, and the whole job ends non-zero before training.
    import shutil

    from comm_fakes import run_mpi

    # a copy of its own: a rank the launcher is still ending may hold the lock a moment
    ldb = str(tmp_path / "ldb")
    shutil.copytree(dbs[0], ldb)
    (tmp_path / "net.prototxt").write_text(f"""
layer {{ name: "data" type: "Data" top: "data" top: "label"
  data_param {{ source: "{ldb}" batch_size: 2 }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param {{ num_output: 3 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}
""")
    solver = tmp_path / "solver.prototxt"
    solver.write_text(f'net: "{tmp_path}/net.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\n'
                      f'max_iter: 50\nrandom_seed: 1\nsnapshot_prefix: "{tmp_path}/s"\n')
    status, log, seconds = run_mpi(2, ["-m", "mgcaffe", "train", "--solver", solver],
                                   timeout=180, cwd=tmp_path)
    assert status not in (None, 0), log
    assert f"LevelDB {ldb!r} is open in another process: its lock {ldb}/LOCK" in log, log
    assert "each of this job's 2 ranks opens it" in log
    assert f"mgcaffe convert_db {ldb} {ldb}_lmdb" in log
    assert "Iteration 1" not in log and "Traceback" not in log, log


def test_pycaffe_io_reads_either_database(dbs):
    import mgcaffe.io

    ldb, mdb = dbs
    from_ldb, from_lmdb = list(mgcaffe.io.db_datums(ldb)), list(mgcaffe.io.db_datums(mdb))
    assert [k for k, _ in from_ldb] == sorted(k for k, _ in _records())
    assert from_ldb == from_lmdb
    first = sorted(range(RECORDS), key=lambda i: f"{(i * 7) % RECORDS:05d}")[0]
    assert from_ldb[0][1].label == first
    assert mgcaffe.io.datum_to_array(from_ldb[0][1]).shape == (2, 5, 6)
