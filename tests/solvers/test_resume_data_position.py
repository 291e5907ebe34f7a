"""Resume continues the data where it stood: N straight == N/2 + resume + N/2, bit for bit,
with an LMDB Data layer (cursor and mirror/crop RNG), alone and under mpiexec -n 2; a state
without mgcaffe's data-position field (as Caffe writes it) restarts the data at record 0."""

from __future__ import annotations

import numpy as np
import pytest
from comm_fakes import run_mpi

from mgcaffe.data.convert import write_lmdb
from mgcaffe.data.datum import array_to_datum
from mgcaffe.proto import caffe_pb2
from mgcaffe.solvers import snapshot as snap

RECORDS = 23  # not a multiple of the batch: the cursor wraps mid-batch


def _images():
    rng = np.random.default_rng(5)
    return rng.integers(0, 256, size=(RECORDS, 1, 6, 6), dtype=np.uint8)


def _setup(tmp_path, max_iter, batch=4, fmt="BINARYPROTO"):
    db = tmp_path / "db"
    if not db.exists():
        write_lmdb(db, (array_to_datum(im, label=i % 3) for i, im in enumerate(_images())))
    net = tmp_path / "net.prototxt"
    net.write_text(f"""
layer {{ name: "data" type: "Data" top: "data" top: "label"
  transform_param {{ mirror: true crop_size: 5 scale: 0.0039 }}
  data_param {{ source: "{db}" batch_size: {batch} backend: LMDB }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param {{ num_output: 3 weight_filler {{ type: "gaussian" std: 0.1 }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}
""")
    solver = tmp_path / f"solver{max_iter}.prototxt"
    solver.write_text(f'net: "{net}"\nbase_lr: 0.1\nmomentum: 0.9\nlr_policy: "fixed"\n'
                      f'display: 0\nmax_iter: {max_iter}\nrandom_seed: 7\nsnapshot: 5\n'
                      f'snapshot_format: {fmt}\nsnapshot_prefix: "{tmp_path}/s{max_iter}"\n')
    return solver


def _weights(path):
    msg = caffe_pb2.NetParameter()
    msg.ParseFromString(open(path, "rb").read())
    return [np.array(b.data) for layer in msg.layer for b in layer.blobs]


def _train(solver_path, resume=None):
    import mgcaffe  # noqa: PLC0415

    solver = mgcaffe.get_solver(str(solver_path))
    try:
        if resume:
            solver.restore(str(resume))
        solver.solve()
    finally:
        solver.close()


@pytest.mark.parametrize("fmt, ext", [("BINARYPROTO", ""), ("HDF5", ".h5")])
def test_resume_continues_the_data_exactly(tmp_path, fmt, ext):
    _train(_setup(tmp_path, 10, fmt=fmt))
    straight = tmp_path / f"s10_iter_10.caffemodel{ext}"
    state = tmp_path / f"s10_iter_5.solverstate{ext}"
    assert snap.read_state(str(state)).data_position  # the field is written
    second = _setup(tmp_path, 10, fmt=fmt)
    second.write_text(second.read_text().replace("/s10", "/r10"))
    _train(second, resume=state)
    a, b = tmp_path / f"s10_iter_10.caffemodel{ext}", tmp_path / f"r10_iter_10.caffemodel{ext}"
    if ext:
        import h5py  # noqa: PLC0415

        with h5py.File(a) as fa, h5py.File(b) as fb:
            for k in ("0", "1"):
                assert np.array_equal(fa["data/ip"][k][()], fb["data/ip"][k][()])
        return
    for x, y in zip(_weights(straight), _weights(b)):
        assert np.array_equal(x, y)


def test_state_without_the_field_restarts_at_record_zero(tmp_path):
    import mgcaffe  # noqa: PLC0415

    _train(_setup(tmp_path, 5))
    path = tmp_path / "s5_iter_5.solverstate"
    msg = caffe_pb2.SolverState()
    msg.ParseFromString(path.read_bytes())
    assert msg.HasField("mgcaffe_data_position")
    msg.ClearField("mgcaffe_data_position")  # what real Caffe writes
    caffe_like = tmp_path / "caffe.solverstate"
    caffe_like.write_bytes(msg.SerializeToString())
    solver = mgcaffe.get_solver(str(_setup(tmp_path, 5)))
    try:
        solver.restore(str(caffe_like))
        solver.net.forward()
        # labels are i % 3 for record i: a restart reads records 0..3
        assert solver.net.blobs["label"].data.tolist() == [0, 1, 2, 0]
        solver.restore(str(path))  # with the field: records 20, 21, 22, 0 (wrapped)
        solver.net.forward()
        assert solver.net.blobs["label"].data.tolist() == [20 % 3, 21 % 3, 22 % 3, 0]
    finally:
        solver.close()


def _image_data(tmp_path):
    from PIL import Image  # noqa: PLC0415

    lines = []
    for i, im in enumerate(_images()[:7]):
        Image.fromarray(im[0]).save(tmp_path / f"im{i}.png")
        lines.append(f"im{i}.png {i % 3}")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    return (f'layer {{ name: "data" type: "ImageData" top: "data" top: "label" '
            f'transform_param {{ mirror: true crop_size: 5 scale: 0.0039 }} '
            f'image_data_param {{ source: "{tmp_path}/list.txt" root_folder: "{tmp_path}/" '
            f'batch_size: 3 shuffle: true is_color: false }} }}')


def _hdf5_data(tmp_path, parts=((0, 5), (5, 11))):
    import h5py  # noqa: PLC0415

    images = _images().astype(np.float32) / 255
    names = []
    for k, (lo, hi) in enumerate(parts):
        with h5py.File(tmp_path / f"d{k}.h5", "w") as f:
            f["data"] = images[lo:hi]
            f["label"] = (np.arange(lo, hi) % 3).astype(np.float32)
        names.append(str(tmp_path / f"d{k}.h5"))
    (tmp_path / "h5list.txt").write_text("\n".join(names) + "\n")
    return (f'layer {{ name: "data" type: "HDF5Data" top: "data" top: "label" '
            f'hdf5_data_param {{ source: "{tmp_path}/h5list.txt" batch_size: 4 '
            f'shuffle: true }} }}')


def _hdf5_one_file(tmp_path):  # each pass reshuffles the last pass's row order
    return _hdf5_data(tmp_path, parts=((0, 7),))


@pytest.mark.parametrize("make_layer", [_image_data, _hdf5_data, _hdf5_one_file],
                         ids=["ImageData", "HDF5Data", "HDF5Data-one-file"])
def test_resume_continues_other_data_layers_exactly(tmp_path, make_layer):
    solver = _setup(tmp_path, 10)
    net = tmp_path / "net.prototxt"
    text = net.read_text()
    start = text.index("layer {")
    end = text.index('layer { name: "ip"')
    net.write_text(text[:start] + make_layer(tmp_path) + "\n" + text[end:])
    _train(solver)
    resumed = tmp_path / "resumed.prototxt"
    resumed.write_text(solver.read_text().replace("/s10", "/r10"))
    _train(resumed, resume=tmp_path / "s10_iter_5.solverstate")
    for x, y in zip(_weights(tmp_path / "s10_iter_10.caffemodel"),
                    _weights(tmp_path / "r10_iter_10.caffemodel")):
        assert np.array_equal(x, y)


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_resume_continues_the_data_exactly_under_mpiexec(tmp_path):
    solver = _setup(tmp_path, 10, batch=2)
    cmd = ["-m", "mgcaffe", "train", "--solver", solver, "--comm", "wfbp"]
    status, log, _ = run_mpi(2, cmd, timeout=200)
    assert status == 0, log
    assert "[rank 0]" not in log and "] Optimization Done." in log  # rank 0: no prefix
    resumed = tmp_path / "resumed.prototxt"
    resumed.write_text(solver.read_text().replace("/s10", "/r10"))
    status, log, _ = run_mpi(2, ["-m", "mgcaffe", "train", "--solver", resumed, "--comm",
                                 "wfbp", "--snapshot", tmp_path / "s10_iter_5.solverstate"],
                             timeout=200)
    assert status == 0, log
    assert "data positions were saved" not in log
    for x, y in zip(_weights(tmp_path / "s10_iter_10.caffemodel"),
                    _weights(tmp_path / "r10_iter_10.caffemodel")):
        assert np.array_equal(x, y)
