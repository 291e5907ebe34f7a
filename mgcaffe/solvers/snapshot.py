"""Snapshot files: `<prefix>_iter_N.caffemodel[.h5]` and `<prefix>_iter_N.solverstate[.h5]`.

Binary proto files hold a NetParameter (weights) and a SolverState (iter, learned_net,
history blobs, current_step). HDF5 files use Caffe's layout: weights in `data/<layer>/<i>`
(one group per layer), state as scalar datasets `iter`, `learned_net`, `current_step` and
the history blobs in `history/<i>`. Every file is written whole to a temporary file and
renamed over the target, so an interrupted snapshot never leaves a truncated file.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field

import numpy as np

from ..backend import to_host
from ..errors import ParseError, SolverError
from ..proto import caffe_pb2

BINARYPROTO = caffe_pb2.SolverParameter.BINARYPROTO
HDF5 = caffe_pb2.SolverParameter.HDF5


@dataclass
class SolverStateData:
    """What a .solverstate file holds, with history blobs as host arrays."""

    iter: int = 0
    learned_net: str = ""
    current_step: int = 0
    history: list[np.ndarray] = field(default_factory=list)
    data_position: bytes = b""  # mgcaffe's extension (solvers/data_position.py)


def snapshot_filename(prefix: str, iteration: int, extension: str) -> str:
    """Caffe's SnapshotFilename: prefix + "_iter_" + N + extension."""
    return f"{prefix}_iter_{int(iteration)}{extension}"


def _protoio():
    from .. import protoio  # noqa: PLC0415 - protoio pulls in text_format; load when used

    return protoio


# -- weights ------------------------------------------------------------------------------
def write_weights(net, path: str, fmt: int = BINARYPROTO, write_diff: bool = False) -> None:
    """Write the net's learned parameters to `path` atomically (binary proto or HDF5)."""
    if fmt == HDF5:
        data = _hdf5_bytes(lambda f: _write_weights_hdf5(f, net, write_diff))
    else:
        data = net.to_proto(write_diff=write_diff).SerializeToString()
    _protoio().atomic_write_bytes(path, data)


def _write_weights_hdf5(f, net, write_diff: bool) -> None:
    groups = [f.create_group("data")] + ([f.create_group("diff")] if write_diff else [])
    for name in net.layer_names:
        blobs = net.params.get(name, [])
        for g, attr in zip(groups, ("data", "diff")):
            layer_group = g.create_group(name)
            for i, blob in enumerate(blobs):
                layer_group.create_dataset(str(i), data=to_host(getattr(blob, attr)))


def load_weights(net, path: str) -> None:
    """Copy trained layers from a .caffemodel or a .caffemodel.h5 file (through the Net)."""
    if not os.path.isfile(path):
        raise SolverError(f"{path}: weights file not found")
    net.copy_from(path)


# -- solver state -------------------------------------------------------------------------
def write_state(path: str, state: SolverStateData, fmt: int = BINARYPROTO) -> None:
    """Write a solver state atomically, as a SolverState proto or in Caffe's HDF5 layout."""
    if fmt == HDF5:
        data = _hdf5_bytes(lambda f: _write_state_hdf5(f, state))
    else:
        msg = caffe_pb2.SolverState(iter=state.iter, learned_net=state.learned_net,
                                    current_step=state.current_step)
        if state.data_position:
            msg.mgcaffe_data_position = state.data_position
        to_blobproto = _protoio().array_to_blobproto
        for arr in state.history:
            msg.history.append(to_blobproto(to_host(arr)))
        data = msg.SerializeToString()
    _protoio().atomic_write_bytes(path, data)


def _write_state_hdf5(f, state: SolverStateData) -> None:
    f.create_dataset("iter", data=np.int32(state.iter))
    f.create_dataset("learned_net", data=np.bytes_(state.learned_net.encode()))
    f.create_dataset("current_step", data=np.int32(state.current_step))
    history = f.create_group("history")
    for i, arr in enumerate(state.history):
        history.create_dataset(str(i), data=to_host(arr))
    if state.data_position:  # a dataset Caffe's reader never asks for
        f.create_dataset("mgcaffe_data_position", data=np.bytes_(state.data_position))


def read_state(path: str) -> SolverStateData:
    """Read a .solverstate (binary proto) or .solverstate.h5 file."""
    if not os.path.isfile(path):
        raise SolverError(f"{path}: solver state file not found")
    if path.endswith(".h5"):
        return _read_state_hdf5(path)
    msg = caffe_pb2.SolverState()
    try:
        with open(path, "rb") as f:
            msg.ParseFromString(f.read())
    except Exception as exc:  # noqa: BLE001 - protobuf raises several types for bad input
        raise ParseError(f"{path}: not a SolverState binary proto ({exc})") from None
    to_array = _protoio().blobproto_to_array
    return SolverStateData(iter=msg.iter, learned_net=msg.learned_net,
                           current_step=msg.current_step,
                           history=[np.asarray(to_array(b)) for b in msg.history],
                           data_position=msg.mgcaffe_data_position)


def _read_state_hdf5(path: str) -> SolverStateData:
    import h5py  # noqa: PLC0415 - only HDF5 snapshots need it

    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise ParseError(f"{path}: not a readable HDF5 file ({exc})") from None
    with f:
        try:
            learned = f["learned_net"][()] if "learned_net" in f else b""
            history = f["history"] if "history" in f else {}
            return SolverStateData(
                iter=int(f["iter"][()]),
                learned_net=learned.decode() if isinstance(learned, bytes) else str(learned),
                current_step=int(f["current_step"][()]) if "current_step" in f else 0,
                history=[np.asarray(history[str(i)]) for i in range(len(history))],
                data_position=(bytes(f["mgcaffe_data_position"][()])
                               if "mgcaffe_data_position" in f else b""),
            )
        except KeyError as exc:
            raise ParseError(f"{path}: missing {exc} (expected Caffe's HDF5 solver state "
                             "layout: iter, learned_net, current_step, history/<i>)") from None


def resolve_learned_net(learned_net: str, state_path: str) -> str:
    """The weights file a state names: as written (Caffe, relative to the current directory),
    else next to the state file (a snapshot directory that was moved)."""
    if os.path.isfile(learned_net):
        return learned_net
    alt = os.path.join(os.path.dirname(os.path.abspath(state_path)),
                       os.path.basename(learned_net))
    if os.path.isfile(alt):
        return alt
    raise SolverError(f"{state_path}: learned_net {learned_net!r} not found (nor next to "
                      "the state file)")


def _hdf5_bytes(write) -> bytes:
    import h5py  # noqa: PLC0415 - only HDF5 snapshots need it

    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        write(f)
    return buffer.getvalue()
