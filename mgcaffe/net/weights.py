"""A Net's weights in and out: Caffe's CopyTrainedLayersFrom, ToProto, ShareTrainedLayersWith.

Layers are matched by name. A source layer with no layer of its name in the net is ignored
(the net keeps that layer's initial values); a matched layer must have as many blobs as the
source, each of the same shape. Old caffemodels give 4-D legacy shapes (num, channels,
height, width); like Caffe, those match a blob of at most 4 axes whose shape, padded on the
left with 1s to 4 axes, is equal (an InnerProduct weight (M, N) stored as 1x1xMxN).
"""

from __future__ import annotations

import logging
import os
import stat

from ..backend import to_host
from ..errors import NetError
from ..formats.protoio import (
    array_to_blobproto,
    atomic_write_bytes,
    blobproto_shape,
    blobproto_to_array,
    hdf5_bytes,
    read_caffemodel,
    read_net_param,
)
from ..proto import caffe_pb2

log = logging.getLogger(__name__)

_LEGACY_FIELDS = ("num", "channels", "height", "width")


def _legacy_dims(blob_proto) -> tuple[int, ...] | None:
    if any(blob_proto.HasField(f) for f in _LEGACY_FIELDS):
        return tuple(int(getattr(blob_proto, f)) for f in _LEGACY_FIELDS)
    return None


def shape_matches(shape: tuple[int, ...], blob_proto) -> bool:
    """Caffe's Blob::ShapeEquals(BlobProto)."""
    legacy = _legacy_dims(blob_proto)
    if legacy is not None:
        return len(shape) <= 4 and (1,) * (4 - len(shape)) + tuple(shape) == legacy
    return tuple(shape) == tuple(int(d) for d in blob_proto.shape.dim)


def _source_param(source) -> caffe_pb2.NetParameter:
    if isinstance(source, (str, os.PathLike)):
        return read_caffemodel(source)
    if isinstance(source, caffe_pb2.NetParameter):
        return read_net_param(source)
    raise NetError(f"copy_from: expected a .caffemodel path or a NetParameter, got "
                   f"{type(source).__name__}")


_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def is_hdf5_file(path) -> bool:
    """Whether `path` is an HDF5 file (H5Fis_hdf5's test: the signature at byte 0, 512,
    1024, 2048, ...), which is how Caffe tells .caffemodel.h5 weights from binary ones."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False  # a FIFO would block in open(); the binary reader refuses it
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            offset = 0
            while offset + len(_HDF5_SIGNATURE) <= size:
                handle.seek(offset)
                if handle.read(len(_HDF5_SIGNATURE)) == _HDF5_SIGNATURE:
                    return True
                offset = 512 if offset == 0 else offset * 2
    except OSError:
        return False
    return False


def copy_trained_layers(net, source) -> set[str]:
    """Copy the parameter blobs of `source` (a .caffemodel or .caffemodel.h5 path, or a
    NetParameter) into `net` by layer name; returns the names of the net's layers that got
    weights."""
    if isinstance(source, (str, os.PathLike)) and is_hdf5_file(source):
        return copy_trained_layers_hdf5(net, source)
    param = _source_param(source)
    loaded = set()
    for src in param.layer:
        if src.name not in net._layer_index:
            log.info("Ignoring source layer %s", src.name)
            continue
        target = net.layers[net._layer_index[src.name]].blobs
        if len(target) != len(src.blobs):
            raise NetError(f"copy_from: layer {src.name!r} has {len(target)} parameter "
                           f"blobs in the net but {len(src.blobs)} in the weights")
        for j, (blob, bp) in enumerate(zip(target, src.blobs)):
            if not shape_matches(blob.shape, bp):
                raise NetError(f"copy_from: layer {src.name!r} blob {j}: the weights have "
                               f"shape {blobproto_shape(bp)}, the net expects {blob.shape}; "
                               f"rename the layer to learn it from scratch")
            values = blobproto_to_array(bp, blob.dtype, where=f"layer {src.name!r} blob {j}")
            blob.data[...] = net.xp.asarray(values.reshape(blob.shape))
        if target:
            loaded.add(src.name)
    return loaded


def report_initialised(net, loaded: set[str], sources: str,
                       remedy: str = "leave --weights out to train from the fillers") -> None:
    """After loading `sources` (the --weights text, or the weights of a --snapshot): an error
    when they initialise none of the net's layers with parameters (`remedy` says what to do),
    a warning listing those left at their fillers when they initialise some. Caffe says
    nothing; a typo in layer names then trains from scratch without a word."""
    learnable = [name for name, layer in zip(net.layer_names, net.layers) if layer.blobs]
    missing = [name for name in learnable if name not in loaded]
    if not missing:
        return
    if len(missing) == len(learnable):
        raise NetError(f"weights {sources}: no layer name matches a layer of net "
                       f"{net.name!r} with parameters ({_names(learnable)}), so they would "
                       f"initialise nothing; rename the layers, or {remedy}")
    log.warning("weights %s initialise %d of the %d layers with parameters; left at their "
                "fillers: %s", sources, len(learnable) - len(missing), len(learnable),
                _names(missing))


def _names(names: list[str], limit: int = 12) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def copy_trained_layers_hdf5(net, path) -> set[str]:
    """Caffe's CopyTrainedLayersFromHDF5: group `data/<layer>/<j>` holds blob j of a layer.

    A layer the net lacks is ignored; a layer may omit a blob only where the net shares it
    from another layer; shapes must be equal.
    """
    import h5py  # noqa: PLC0415 - only HDF5 weights need it

    try:
        handle = h5py.File(path, "r")
    except OSError as exc:
        raise NetError(f"{path}: not a readable HDF5 file ({exc})") from None
    with handle:
        if "data" not in handle:
            raise NetError(f"{path}: no 'data' group; expected Caffe's HDF5 weights layout "
                           "(data/<layer name>/<blob index>)")
        first_param = _first_param_ids(net)
        loaded = set()
        for name, group in handle["data"].items():
            if name not in net._layer_index:
                log.info("Ignoring source layer %s", name)
                continue
            layer_id = net._layer_index[name]
            target = net.layers[layer_id].blobs
            if len(group) > len(target):
                raise NetError(f"{path}: layer {name!r} has {len(group)} parameter blobs in "
                               f"the weights but {len(target)} in the net")
            for j, blob in enumerate(target):
                if str(j) not in group:
                    if net.param_owners[first_param[layer_id] + j] >= 0:
                        continue  # shared from another layer: loaded there
                    raise NetError(f"{path}: layer {name!r} has no blob {j} in the weights; "
                                   f"the net's layer has {len(target)}")
                values = group[str(j)][()]
                if tuple(values.shape) != tuple(blob.shape):
                    raise NetError(f"{path}: layer {name!r} blob {j}: the weights have shape "
                                   f"{tuple(values.shape)}, the net expects {blob.shape}")
                blob.data[...] = net.xp.asarray(values, dtype=blob.dtype)
            if target and len(group):
                loaded.add(name)
    return loaded


def _first_param_ids(net) -> list[int]:
    # Parameters are numbered layer by layer, in order (Caffe's param_id_vecs_).
    ids, count = [], 0
    for layer in net.layers:
        ids.append(count)
        count += len(layer.blobs)
    return ids


def net_to_proto(net, write_diff: bool = False) -> caffe_pb2.NetParameter:
    """Caffe's Net::ToProto: name, every layer's parameter message, and its blobs."""
    out = caffe_pb2.NetParameter()
    out.name = net.name
    for layer in net.layers:
        lp = out.layer.add()
        lp.CopyFrom(layer.param)
        del lp.blobs[:]
        for blob in layer.blobs:
            diff = to_host(blob.diff) if write_diff else None
            lp.blobs.append(array_to_blobproto(to_host(blob.data), diff))
    return out


def share_trained_layers(net, other) -> None:
    """Alias `net`'s parameter data to `other`'s, for every layer name both nets have."""
    for name, source_layer in zip(other.layer_names, other.layers):
        if name not in net._layer_index:
            continue
        target = net.layers[net._layer_index[name]].blobs
        if len(target) != len(source_layer.blobs):
            raise NetError(f"share_weights: layer {name!r} has {len(target)} parameter blobs "
                           f"here but {len(source_layer.blobs)} in net {other.name!r}")
        for j, (mine, theirs) in enumerate(zip(target, source_layer.blobs)):
            if mine.shape != theirs.shape:
                raise NetError(f"share_weights: layer {name!r} blob {j}: shape {mine.shape} "
                               f"here, {theirs.shape} in net {other.name!r}")
            mine.share_data(theirs)


# -- writing ------------------------------------------------------------------------------
BINARYPROTO = caffe_pb2.SolverParameter.BINARYPROTO
HDF5 = caffe_pb2.SolverParameter.HDF5


def write_weights(net, path: str, fmt: int = BINARYPROTO, write_diff: bool = False) -> None:
    """Write the net's learned parameters to `path` atomically (binary proto or HDF5)."""
    atomic_write_bytes(path, weights_bytes(net, fmt, write_diff))


def weights_bytes(net, fmt: int = BINARYPROTO, write_diff: bool = False) -> bytes:
    """The bytes of a .caffemodel (binary NetParameter) or .caffemodel.h5 of the net."""
    if fmt == HDF5:
        return hdf5_bytes(lambda f: _write_weights_hdf5(f, net, write_diff))
    return net_to_proto(net, write_diff=write_diff).SerializeToString()


def _write_weights_hdf5(f, net, write_diff: bool) -> None:
    # Caffe's layout: data/<layer>/<i> (and diff/<layer>/<i>), one group per layer.
    groups = [f.create_group("data")] + ([f.create_group("diff")] if write_diff else [])
    for name, layer in zip(net.layer_names, net.layers):
        blobs = layer.blobs
        for g, attr in zip(groups, ("data", "diff")):
            layer_group = g.create_group(name)
            for i, blob in enumerate(blobs):
                layer_group.create_dataset(str(i), data=to_host(getattr(blob, attr)))
