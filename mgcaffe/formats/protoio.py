"""Reading and writing Caffe's files: prototxt, .caffemodel, .binaryproto, .solverstate.

Every reader raises `ParseError` naming the file (and line:column for text); nets and solvers
are upgraded from deprecated forms on load (see `upgrade`). Every file mgcaffe writes goes
through `atomic_write_bytes`, so a crash never leaves a half-written snapshot behind.
"""

from __future__ import annotations

import io
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import message as pb_message
from google.protobuf import text_format

from ..errors import MgcaffeError, NetError, ParseError
from ..proto import caffe_pb2
from .jsonio import read_regular_file
from .settings_check import check_net_settings
from .upgrade import upgrade_net, upgrade_solver

PathLike = str | os.PathLike

_PROTOBUF_POSITION = re.compile(r"^\d+:\d+ : ")

log = logging.getLogger("mgcaffe.formats.protoio")


# ---------------------------------------------------------------------------------------------
# Text format


#: Text files (prototxt) larger than this many MiB are refused: protobuf's text parser reads
#: about 0.3-1 MB/s (a 100 MB net took minutes), and real nets are well under 2 MB.
#: MGCAFFE_MAX_PROTOTXT_MB raises (or lowers) the limit.
MAX_PROTOTXT_MB = 16
MAX_PROTOTXT_ENV = "MGCAFFE_MAX_PROTOTXT_MB"
#: Binary messages are limited by protobuf itself (2 GiB), as in Caffe.
MAX_BINARY_BYTES = (2 << 30) - 1
#: A parse of more lines than this logs how far it got every PROGRESS_SECONDS.
PROGRESS_LINES = 20_000
PROGRESS_SECONDS = 5.0


def read_prototxt(path: PathLike, message: pb_message.Message) -> pb_message.Message:
    """Parse the text-format file `path` into `message` (cleared first) and return it."""
    return parse_text(_read_text(path), message, source=str(path))


def parse_text(text: str, message: pb_message.Message,
               source: str = "<string>") -> pb_message.Message:
    """Parse text-format `text` into `message`; a syntax error names `source:line:col`."""
    message.Clear()
    lines = text.split("\n")
    try:
        # ParseLines is what Parse calls; fed line by line, a long parse can say how far it is.
        text_format.ParseLines(_progress(lines, source) if len(lines) > PROGRESS_LINES
                               else lines, message)
    except text_format.ParseError as exc:
        line, col = exc.GetLine(), exc.GetColumn()
        detail = _short_quotes(_PROTOBUF_POSITION.sub("", str(exc)))
        raise ParseError(f"{source}:{line}:{col}: {detail}{_v1_hint(text, line, col)}") from None
    return message


def _progress(lines: list[str], source: str):
    total, started = len(lines), time.monotonic()
    last = started
    for i, line in enumerate(lines):
        if i and i % 4096 == 0 and time.monotonic() - last >= PROGRESS_SECONDS:
            last = time.monotonic()
            log.info("Parsing %s: line %d of %d (%.0f%%, %.0f s)", source, i, total,
                     100.0 * i / total, last - started)
        yield line


def _short_quotes(detail: str, keep: int = 40) -> str:
    """The message with every long quoted token cut to an excerpt (a 10 MB token is an
    error worth one line, not 10 MB of terminal)."""
    def cut(match: re.Match) -> str:
        body = match.group(1)
        return f'"{body[:keep]}..." ({len(body)} characters)'

    detail = re.sub(f'"([^"]{{{2 * keep},}})"', cut, detail)
    return detail if len(detail) <= 400 else detail[:400] + "..."


def max_prototxt_bytes() -> int:
    """The size limit of a prototxt: MAX_PROTOTXT_MB, or MGCAFFE_MAX_PROTOTXT_MB when set."""
    value = os.environ.get(MAX_PROTOTXT_ENV)
    if value is None:
        return MAX_PROTOTXT_MB << 20
    try:
        mb = float(value)
        if not mb > 0:
            raise ValueError
    except ValueError:
        raise MgcaffeError(f"{MAX_PROTOTXT_ENV}={value!r}: expected a size in MiB > 0") from None
    return int(mb * (1 << 20))


def write_prototxt(message: pb_message.Message, path: PathLike) -> None:
    """Write `message` in text format to `path` (atomically)."""
    atomic_write_bytes(path, text_format.MessageToString(message).encode("utf-8"))


def _read_text(path: PathLike) -> str:
    limit = max_prototxt_bytes()
    data = read_regular_file(path, limit, ParseError, "prototxt",
                             hint=f"; set {MAX_PROTOTXT_ENV} (MiB) to read a bigger one")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParseError(f"{path}: not a UTF-8 text file (byte {exc.start}); "
                         "expected a prototxt") from None


def _v1_hint(text: str, line: int, col: int) -> str:
    """A hint when the error sits inside a legacy `layers {}` block: V1 field names only, or
    V0 ones in its nested `layer {}`."""
    # Walk the text up to the error, tracking the names of the open blocks.
    stack: list[str] = []
    lines = text.splitlines()[:line]
    if lines:
        lines[-1] = lines[-1][: max(col - 1, 0)]
    for raw in lines:
        code = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|#.*', "", raw)
        for match in re.finditer(r"(\w+)\s*:?\s*\{|\}", code):
            if match.group(0) == "}":
                if stack:
                    stack.pop()
            else:
                stack.append(match.group(1))
    if stack[:2] == ["layers", "layer"]:
        return (" (inside a V0 `layers { layer {} }` block, which takes V0 fields only, e.g. "
                "type: \"conv\", kernelsize, num_output, blobs_lr)")
    if stack and stack[0] == "layers":
        return (" (inside a legacy V1 `layers {}` block, which takes V1 fields only, e.g. "
                "blobs_lr/weight_decay and enum types; write current fields in `layer {}`)")
    return ""


# ---------------------------------------------------------------------------------------------
# Nets and solvers


def parse_net_text(text: str, source: str = "<string>") -> caffe_pb2.NetParameter:
    """Parse a net prototxt given as text and upgrade it to the current format."""
    net = parse_text(text, caffe_pb2.NetParameter(), source=source)
    return upgrade_net(net, source)


def read_net_param(path_or_netparam: PathLike | caffe_pb2.NetParameter) -> caffe_pb2.NetParameter:
    """Read a net prototxt (or copy a NetParameter) and upgrade it to the current format.

    A given NetParameter is not modified; the result is always a new message.
    """
    if isinstance(path_or_netparam, caffe_pb2.NetParameter):
        net = caffe_pb2.NetParameter()
        net.CopyFrom(path_or_netparam)
        return upgrade_net(net, f"<NetParameter {net.name!r}>")
    source = str(path_or_netparam)
    return parse_net_text(_read_text(source), source=source)


def _shapeless_inputs(net: caffe_pb2.NetParameter) -> list[str]:
    """Inputs declared with `input:` and neither input_shape nor input_dim."""
    if len(net.input_shape) or len(net.input_dim):
        return []
    return list(net.input)


def _check_inputs_have_shapes(net: caffe_pb2.NetParameter, shapeless: list[str],
                              source: str) -> None:
    # Caffe's upgrade drops inputs without a shape (old .caffemodel files declare them);
    # the first layer reading one would then fail as if it were never declared.
    produced: set[str] = set()
    for layer in net.layer:
        for name in layer.bottom:
            if name in shapeless and name not in produced:
                raise NetError(
                    f"{source}: layer {layer.name!r}: net input {name!r} (declared with "
                    f"`input: \"{name}\"`) has no shape; give it one with `input_shape "
                    "{ dim: N dim: C dim: H dim: W }` or four `input_dim` values after the "
                    "input, or make it an Input layer (`type: \"Input\"` with "
                    "`input_param { shape { dim: ... } }`)")
        produced.update(layer.top)


def read_net_to_build(model, source: str | None = None) -> caffe_pb2.NetParameter:
    """`read_net_param` for a net about to be built: also refuses a net input without a
    shape that a layer reads, and settings that are not finite or out of range
    (settings_check). `source` names a given NetParameter in errors (a solver's
    `net_param`, say); a path names itself."""
    if isinstance(model, caffe_pb2.NetParameter):
        raw = caffe_pb2.NetParameter()
        raw.CopyFrom(model)
        source = source or f"<NetParameter {raw.name!r}>"
    else:
        source = str(model)
        raw = parse_text(_read_text(source), caffe_pb2.NetParameter(), source=source)
    shapeless = _shapeless_inputs(raw)
    net = upgrade_net(raw, source)
    if shapeless:
        _check_inputs_have_shapes(net, shapeless, source)
    check_net_settings(net, source)
    return net


def read_solver_param(path: PathLike) -> caffe_pb2.SolverParameter:
    """Read a solver prototxt, upgrading the deprecated `solver_type` enum to `type`."""
    solver = read_prototxt(path, caffe_pb2.SolverParameter())
    return upgrade_solver(solver, str(path))


# ---------------------------------------------------------------------------------------------
# Binary messages


def read_message(path: PathLike, message: pb_message.Message) -> pb_message.Message:
    """Parse the binary protobuf file `path` into `message` and return it."""
    kind = message.DESCRIPTOR.name
    data = read_regular_file(path, MAX_BINARY_BYTES, ParseError, f"binary {kind}")
    try:
        message.ParseFromString(data)
    except pb_message.DecodeError as exc:
        raise ParseError(f"{path}: not a binary {kind} ({exc})") from None
    return message


def write_message(message: pb_message.Message, path: PathLike) -> None:
    """Write `message` in binary protobuf form to `path` (atomically)."""
    atomic_write_bytes(path, message.SerializeToString())


def read_caffemodel(path: PathLike) -> caffe_pb2.NetParameter:
    """Read a binary .caffemodel (weights in each layer's `blobs`), upgrading V1 nets."""
    net = read_message(path, caffe_pb2.NetParameter())
    if not net.layer and not net.layers:
        raise ParseError(f"{path}: a .caffemodel holds no layers; expected a binary "
                         "NetParameter with trained blobs")
    return upgrade_net(net, str(path))


def write_caffemodel(netparam: caffe_pb2.NetParameter, path: PathLike) -> None:
    """Write a NetParameter with its blobs as a binary .caffemodel (atomically)."""
    write_message(netparam, path)


def read_solverstate(path: PathLike) -> caffe_pb2.SolverState:
    """Read a binary .solverstate (iteration, learned net file, history blobs)."""
    return read_message(path, caffe_pb2.SolverState())


def write_solverstate(state: caffe_pb2.SolverState, path: PathLike) -> None:
    """Write a SolverState as a binary .solverstate (atomically)."""
    write_message(state, path)


# ---------------------------------------------------------------------------------------------
# Blobs


def blobproto_shape(bp: caffe_pb2.BlobProto) -> tuple[int, ...]:
    """The shape a BlobProto declares: legacy num/channels/height/width when any is set
    (Caffe checks those first), otherwise `shape.dim`."""
    if any(bp.HasField(f) for f in ("num", "channels", "height", "width")):
        return (bp.num, bp.channels, bp.height, bp.width)
    return tuple(int(d) for d in bp.shape.dim)


def blobproto_to_array(bp: caffe_pb2.BlobProto, dtype=np.float32, *, diff: bool = False,
                       where: str = "blob") -> np.ndarray | None:
    """The data (or with `diff=True` the diff) of `bp` as an array of its declared shape.

    `double_data`/`double_diff` are used when present. A diff that was not stored gives
    None; data whose length does not match the shape is an error naming `where`.
    """
    shape = blobproto_shape(bp)
    if diff:
        values, kind = (bp.double_diff, "double_diff") if bp.double_diff else (bp.diff, "diff")
        if not values:
            return None
    else:
        values, kind = (bp.double_data, "double_data") if bp.double_data else (bp.data, "data")
    count = int(np.prod(shape, dtype=np.int64))
    if len(values) != count:
        raise ParseError(f"{where}: shape {list(shape)} needs {count} values but {kind} "
                         f"holds {len(values)}")
    source_dtype = np.float64 if kind.startswith("double") else np.float32
    return np.asarray(values, dtype=source_dtype).astype(dtype, copy=False).reshape(shape)


def array_to_blobproto(data, diff=None) -> caffe_pb2.BlobProto:
    """A BlobProto (with BlobShape) holding `data` and optionally `diff`.

    float64 data goes to double_data/double_diff (as Caffe's double blobs do); anything
    else is stored as float32. The diff is stored in the data's precision.
    """
    data = np.asarray(data)
    shape = caffe_pb2.BlobShape(dim=[int(d) for d in data.shape])
    double = data.dtype == np.float64
    wire = [_length_delimited(_BLOB_FIELDS["shape"], shape.SerializeToString()),
            _packed(_BLOB_FIELDS["double_data" if double else "data"], data, double)]
    if diff is not None:
        diff = np.asarray(diff)
        if diff.shape != data.shape:
            raise MgcaffeError(f"array_to_blobproto: diff shape {list(diff.shape)} differs "
                               f"from data shape {list(data.shape)}")
        wire.append(_packed(_BLOB_FIELDS["double_diff" if double else "diff"], diff, double))
    # Building the packed fields as bytes and parsing them is ~20x faster than appending
    # millions of Python floats to a repeated field.
    return caffe_pb2.BlobProto.FromString(b"".join(wire))


_BLOB_FIELDS = {f.name: f.number for f in caffe_pb2.BlobProto.DESCRIPTOR.fields}


def _packed(number: int, values: np.ndarray, double: bool) -> bytes:
    if values.size == 0:
        return b""
    return _length_delimited(number, values.astype("<f8" if double else "<f4").tobytes())


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def read_binaryproto(path: PathLike, dtype=np.float32) -> np.ndarray:
    """Read a .binaryproto BlobProto (a mean file) as an array of its declared shape."""
    bp = read_message(path, caffe_pb2.BlobProto())
    return blobproto_to_array(bp, dtype, where=str(path))


def write_binaryproto(data, path: PathLike) -> None:
    """Write `data` as a .binaryproto BlobProto with a BlobShape (atomically)."""
    write_message(array_to_blobproto(data), path)


# ---------------------------------------------------------------------------------------------
# Files


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    """Write `data` to `path` so that readers see either the old file or the complete new one.

    The bytes go to a temporary file in the same directory (same filesystem), which is
    fsync'ed and then renamed over `path`.
    """
    path = Path(path)
    directory = path.parent
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise MgcaffeError(f"{path}: cannot write: {exc.strerror}") from None
    try:
        # mkstemp creates 0600 files; give the result the permissions open() would.
        os.fchmod(fd, 0o666 & ~_current_umask())
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):
            raise MgcaffeError(f"{path}: cannot write: {exc.strerror}") from None
        raise
    _fsync_directory(directory)


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_directory(directory: Path) -> None:
    # Makes the rename itself durable; not every platform/filesystem allows it.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def require_layers(net, source: str, purpose: str = "run") -> None:
    """Refuse a Net with no layers (an empty prototxt, or every layer excluded by its rules):
    it would train, time or score nothing and report success."""
    if net.layers:
        return
    phase = "TRAIN" if net.phase == caffe_pb2.TRAIN else "TEST"
    raise NetError(f"{source}: the net has no layers in the {phase} phase (an empty file, or "
                   f"include/exclude rules leave none); nothing to {purpose}")


# ---------------------------------------------------------------------------------------------
# Net state filtering


def state_meets_rule(state: caffe_pb2.NetState, rule: caffe_pb2.NetStateRule) -> bool:
    """Caffe's StateMeetsRule: every condition the rule sets must hold for the state."""
    if rule.HasField("phase") and rule.phase != state.phase:
        return False
    if rule.HasField("min_level") and state.level < rule.min_level:
        return False
    if rule.HasField("max_level") and state.level > rule.max_level:
        return False
    stages = set(state.stage)
    if any(stage not in stages for stage in rule.stage):
        return False
    return not any(stage in stages for stage in rule.not_stage)


def layer_included(layer: caffe_pb2.LayerParameter, state: caffe_pb2.NetState) -> bool:
    """Whether `layer` belongs to a net in `state` (no rules: included; include rules: any
    met; exclude rules: none met). Giving both kinds is an error."""
    if layer.include and layer.exclude:
        raise ParseError(f"layer '{layer.name}' has both include and exclude rules; "
                         "give one kind only")
    if layer.include:
        return any(state_meets_rule(state, rule) for rule in layer.include)
    return not any(state_meets_rule(state, rule) for rule in layer.exclude)


def filter_net(netparam: caffe_pb2.NetParameter, phase: int, level: int = 0,
               stages: Iterable[str] = ()) -> caffe_pb2.NetParameter:
    """A copy of `netparam` holding only the layers its include/exclude rules admit for the
    state (phase, level, stages); the copy's `state` is set to that state."""
    if netparam.layers:
        raise ParseError(f"net '{netparam.name}': filter_net needs the current `layer` format; "
                         "load it with read_net_param to upgrade V1 `layers`")
    state = caffe_pb2.NetState(phase=phase, level=level, stage=list(stages))
    kept = [layer for layer in netparam.layer if layer_included(layer, state)]
    filtered = caffe_pb2.NetParameter()
    filtered.CopyFrom(netparam)
    filtered.ClearField("layer")
    filtered.layer.extend(kept)
    filtered.state.CopyFrom(state)
    return filtered


def hdf5_bytes(write: Callable[[Any], None]) -> bytes:
    """The bytes of an HDF5 file that `write(h5py.File)` fills (then written atomically with
    `atomic_write_bytes`, as the other formats are)."""
    import h5py  # noqa: PLC0415 - optional at run time: only HDF5 files need it (~14 MB)

    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        write(f)
    return buffer.getvalue()
