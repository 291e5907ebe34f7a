"""Snapshot files: `<prefix>_iter_N.caffemodel[.h5]` and `<prefix>_iter_N.solverstate[.h5]`.

Binary proto files hold a NetParameter (weights) and a SolverState (iter, learned_net,
history blobs, current_step). HDF5 files use Caffe's layout: weights in `data/<layer>/<i>`
(one group per layer), state as scalar datasets `iter`, `learned_net`, `current_step` and
the history blobs in `history/<i>`.

A snapshot is a pair, committed whole (`write_pair`): both files are written to temporaries
(`.<name>.XXXX.tmp`, fsync'ed), then a marker `<prefix>_iter_N.snapshot-pending` naming the
four files is written, then the temporaries are renamed to Caffe's names and the marker is
removed. A kill before the marker leaves only temporaries (the pair is "neither"); a kill after
it leaves a marker from which `recover_snapshots` finishes the renames (the pair is "both").
`recover_snapshots(prefix)` runs when a solver starts (under the prefix lock) and when a state
is restored, and removes the temporaries of an earlier run.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

from ..backend import to_host
from ..errors import ParseError, SolverError
from ..formats import protoio, snapshot_lock
from ..net.weights import copy_trained_layers
from ..proto import caffe_pb2

BINARYPROTO = caffe_pb2.SolverParameter.BINARYPROTO
HDF5 = caffe_pb2.SolverParameter.HDF5
PENDING_SUFFIX = ".snapshot-pending"
#: Environment variable naming a point of `write_pair` where the process kills itself
#: (SIGKILL); the crash-consistency tests use it. Points: model-partial, before-marker,
#: after-marker, between-renames, before-unmark.
FAULT_ENV = "MGCAFFE_SNAPSHOT_FAULT"

log = logging.getLogger("mgcaffe.solvers.snapshot")


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


# -- weights (written by net/weights.py, which Net.save and Net.save_hdf5 use too) -------
def load_weights(net, path: str) -> set[str]:
    """Copy trained layers from a .caffemodel or a .caffemodel.h5 file; returns the names
    of the net's layers that got weights."""
    _require_file(path, "weights file")
    return copy_trained_layers(net, path)


# -- solver state -------------------------------------------------------------------------
def write_state(path: str, state: SolverStateData, fmt: int = BINARYPROTO) -> None:
    """Write a solver state atomically, as a SolverState proto or in Caffe's HDF5 layout."""
    protoio.atomic_write_bytes(path, state_bytes(state, fmt))


def state_bytes(state: SolverStateData, fmt: int = BINARYPROTO) -> bytes:
    """The bytes of a .solverstate (SolverState proto) or .solverstate.h5."""
    if fmt == HDF5:
        return protoio.hdf5_bytes(lambda f: _write_state_hdf5(f, state))
    msg = caffe_pb2.SolverState(iter=state.iter, learned_net=state.learned_net,
                                current_step=state.current_step)
    if state.data_position:
        msg.mgcaffe_data_position = state.data_position
    to_blobproto = protoio.array_to_blobproto
    for arr in state.history:
        msg.history.append(to_blobproto(to_host(arr)))
    return msg.SerializeToString()


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
    _require_file(path, "solver state file")
    if path.endswith(".h5"):
        return _read_state_hdf5(path)
    msg = caffe_pb2.SolverState()
    data = protoio.read_regular_file(path, protoio.MAX_BINARY_BYTES, ParseError,
                                        "binary SolverState")
    try:
        msg.ParseFromString(data)
    except Exception as exc:  # noqa: BLE001 - protobuf raises several types for bad input
        raise ParseError(f"{path}: not a SolverState binary proto ({exc})") from None
    to_array = protoio.blobproto_to_array
    return _checked(path, SolverStateData(
        iter=msg.iter, learned_net=msg.learned_net, current_step=msg.current_step,
        history=[np.asarray(to_array(b)) for b in msg.history],
        data_position=msg.mgcaffe_data_position))


def _checked(path: str, state: SolverStateData) -> SolverStateData:
    """A state whose counters can be resumed from (Caffe would train from a negative one)."""
    if state.iter < 0:
        raise ParseError(f"{path}: iter is {state.iter}; a solver state's iteration must be "
                         ">= 0 (a damaged or hand-made file?)")
    if state.current_step < 0:
        raise ParseError(f"{path}: current_step is {state.current_step}; must be >= 0")
    return state


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
            return _checked(path, SolverStateData(
                iter=int(f["iter"][()]),
                learned_net=learned.decode() if isinstance(learned, bytes) else str(learned),
                current_step=int(f["current_step"][()]) if "current_step" in f else 0,
                history=[np.asarray(history[str(i)]) for i in range(len(history))],
                data_position=(bytes(f["mgcaffe_data_position"][()])
                               if "mgcaffe_data_position" in f else b""),
            ))
        except KeyError as exc:
            raise ParseError(f"{path}: missing {exc} (expected Caffe's HDF5 solver state "
                             "layout: iter, learned_net, current_step, history/<i>)") from None


def _require_file(path: str, what: str) -> None:
    """A regular file: a FIFO or device is refused before anything opens it (h5py or open
    would block on a FIFO with no writer)."""
    if not os.path.exists(path):
        raise SolverError(f"{path}: {what} not found")
    if not os.path.isfile(path):
        raise SolverError(f"{path}: not a regular file; expected a {what}")


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


# -- whole pairs ----------------------------------------------------------------------------
def pending_marker(prefix_iter: str) -> str:
    """The marker of the pair `<prefix>_iter_N` while it is being committed."""
    return prefix_iter + PENDING_SUFFIX


def pair_stem(state_path: str) -> str:
    """`<prefix>_iter_N` of a `.solverstate[.h5]` or `.caffemodel[.h5]` path (else the path)."""
    for ext in (".solverstate.h5", ".solverstate", ".caffemodel.h5", ".caffemodel"):
        if state_path.endswith(ext):
            return state_path[: -len(ext)]
    return state_path


def write_pair(model_path: str, model_data, state_path: str, state_data) -> None:
    """Write a weights file and its solver state so that both appear or neither does.

    Both must lie in one directory and share the stem `<prefix>_iter_N` (Caffe's names).
    Each data argument is bytes or a function returning them, called when that file is
    written (so the two never need to be in memory at once).
    """
    directory = os.path.dirname(model_path) or "."
    marker = pending_marker(pair_stem(state_path))
    temps: list[str] = []
    try:
        temps.append(_write_temporary(model_path, model_data, fault="model-partial"))
        temps.append(_write_temporary(state_path, state_data))
        _fault("before-marker")
        record = {"model": os.path.basename(model_path), "state": os.path.basename(state_path),
                  "model_tmp": os.path.basename(temps[0]),
                  "state_tmp": os.path.basename(temps[1])}
        protoio.atomic_write_bytes(marker, json.dumps(record).encode())
    except BaseException:
        for tmp in temps:
            _unlink(tmp)
        raise
    # From here on the marker lets a restart finish the commit, so the temporaries stay.
    _fault("after-marker")
    try:
        # An older pair of the same name (a rerun over an earlier snapshot): its state goes
        # first, so that no moment shows the new weights beside the old state.
        _unlink(state_path)
        os.replace(temps[0], model_path)
        _fault("between-renames")
        os.replace(temps[1], state_path)
        protoio._fsync_directory(directory)  # noqa: SLF001 - the same durability step
        _fault("before-unmark")
        os.unlink(marker)
    except OSError as exc:
        raise SolverError(f"{model_path}: cannot commit the snapshot: "
                          f"{exc.strerror or exc}") from None


def _write_temporary(path: str, data, fault: str = "") -> str:
    directory = os.path.dirname(path) or "."
    if callable(data):
        data = data()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                                   dir=directory)
    except OSError as exc:
        raise SolverError(f"{path}: cannot write: {exc.strerror or exc}") from None
    try:
        os.fchmod(fd, 0o666 & ~protoio._current_umask())  # noqa: SLF001
        with os.fdopen(fd, "wb") as handle:
            if fault and os.environ.get(FAULT_ENV) == fault:
                handle.write(data[: len(data) // 2])
                handle.flush()
                _fault(fault)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException as exc:
        _unlink(tmp)
        if isinstance(exc, OSError):
            raise SolverError(f"{path}: cannot write: {exc.strerror or exc}") from None
        raise
    return tmp


def _fault(point: str) -> None:
    if os.environ.get(FAULT_ENV) == point:

        os.kill(os.getpid(), signal.SIGKILL)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def recover_snapshots(prefix: str) -> list[str]:
    """Finish or discard what an interrupted run left for `prefix`; returns what was done.

    A pending marker whose temporaries were written is committed (its renames finished); the
    temporaries of a pair that got no marker are removed; a weights file without its state
    (left by an older version or by hand) is reported, not removed. Call it only while no
    other process snapshots to `prefix` (under the prefix lock).
    """
    directory = os.path.dirname(prefix) or "."
    base = os.path.basename(prefix) + "_iter_"
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    done = []
    for name in sorted(n for n in names if n.startswith(base) and n.endswith(PENDING_SUFFIX)):
        done.append(_finish_pending(directory, name))
    names = os.listdir(directory)
    for name in sorted(n for n in names if n.startswith("." + base) and n.endswith(".tmp")):
        _unlink(os.path.join(directory, name))
        done.append(f"removed the temporary {os.path.join(directory, name)} of an "
                    "interrupted snapshot")
    for line in done:
        log.warning("%s", line)
    orphans = _orphan_models(directory, base, set(names))
    if orphans:
        log.warning("weights without their solver state (kept; they cannot be resumed "
                    "from): %s", ", ".join(os.path.join(directory, n) for n in orphans))
    return done


def recover_pair(state_path: str, writer: bool = True, deadline_s: float = 120.0) -> None:
    """Finish the commit of the pair `state_path` belongs to when a marker says it was
    interrupted (a resume named a state whose rename a kill prevented).

    Only the rank that writes snapshots (`writer`) finishes it; another rank waits, up to
    `deadline_s`, for the marker to go (rank 0 finishes it at start or in its own restore).
    """
    stem = pair_stem(state_path)
    marker = pending_marker(stem)
    if not os.path.exists(marker):
        return
    if not writer:

        end = time.monotonic() + deadline_s
        while os.path.exists(marker):
            if time.monotonic() > end:
                raise SolverError(f"{state_path}: the snapshot's commit was interrupted and "
                                  f"{marker} was not finished by rank 0 in {deadline_s:g} s")
            time.sleep(0.05)
        return

    prefix = stem.rsplit("_iter_", 1)[0]
    if snapshot_lock.held_here(prefix):
        recover_snapshots(prefix)
        return
    # Another process may be committing this very pair: only under its lock.
    with snapshot_lock.acquire(prefix, f"{state_path}: snapshot prefix"):
        recover_snapshots(prefix)


def _finish_pending(directory: str, name: str) -> str:
    marker = os.path.join(directory, name)
    try:
        with open(marker, encoding="utf-8") as handle:
            record = json.load(handle)
        pairs = [(record[f"{kind}_tmp"], record[kind]) for kind in ("model", "state")]
        if any(os.path.basename(p) != p for pair in pairs for p in pair):
            raise ValueError("paths outside the snapshot directory")
    except (OSError, ValueError, KeyError, TypeError):
        _unlink(marker)
        return f"removed the unreadable snapshot marker {marker}"
    for tmp, final in pairs:
        tmp, final = os.path.join(directory, tmp), os.path.join(directory, final)
        if os.path.exists(tmp):
            os.replace(tmp, final)
    finals = [os.path.join(directory, final) for _, final in pairs]
    protoio._fsync_directory(directory)  # noqa: SLF001
    _unlink(marker)
    missing = [f for f in finals if not os.path.exists(f)]
    if not missing:
        return f"completed the interrupted snapshot {finals[0]} + {finals[1]}"
    return (f"the interrupted snapshot {finals[0]} + {finals[1]} cannot be completed: "
            f"{', '.join(missing)} is missing")


def _orphan_models(directory: str, base: str, names: set[str]) -> list[str]:
    orphans = []
    for name in sorted(names):
        if not name.startswith(base):
            continue
        for model_ext, state_ext in ((".caffemodel", ".solverstate"),
                                     (".caffemodel.h5", ".solverstate.h5")):
            if name.endswith(model_ext) and name[: -len(model_ext)] + state_ext not in names:
                orphans.append(name)
    return orphans
