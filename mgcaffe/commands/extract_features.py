"""`mgcaffe extract_features`: blobs of a trained net, image by image, into Datum databases.

    mgcaffe extract_features WEIGHTS NET BLOB1[,BLOB2...] DB1[,DB2...] NUM_BATCHES lmdb|leveldb
                             [CPU|GPU] [DEVICE_ID]

Caffe's tool: the TEST-phase net (with WEIGHTS copied in) runs forward NUM_BATCHES times;
after each pass, every item n of each named blob becomes one Datum in its database: the
item's values in `float_data`, `channels`/`height`/`width` from the blob's legacy 4-D shape
(axes past the blob's own count are 1), no label, under the key `%010d` counting items from
0. Databases that exist already are refused.
"""

from __future__ import annotations

import logging

import numpy as np

from ..backend import CPU, to_host
from ..data.convert import open_writer
from ..data.db import backend_named
from ..errors import NetError
from ..layer_types.base import TEST
from ..net import Net
from ..proto import caffe_pb2
from ..solvers.base import select_device
from ._engine import layer_rules
from ._flags import device_from_flag, split_list

NAME = "extract_features"
HELP = "write the values of net blobs to Datum LMDBs or LevelDBs (Caffe's extract_features)"

log = logging.getLogger("mgcaffe.commands.extract_features")


def add_arguments(parser) -> None:
    parser.add_argument("weights", metavar="WEIGHTS",
                        help="trained weights (.caffemodel or .caffemodel.h5)")
    parser.add_argument("model", metavar="NET", help="the net definition (TEST phase is run)")
    parser.add_argument("blobs", metavar="BLOB1[,BLOB2...]", help="blobs to extract")
    parser.add_argument("dbs", metavar="DB1[,DB2...]", help="one new database per blob")
    parser.add_argument("num_batches", metavar="NUM_BATCHES", type=int,
                        help="forward passes to run")
    parser.add_argument("db_type", metavar="DB_TYPE", help="database type: lmdb or leveldb")
    parser.add_argument("mode", metavar="CPU|GPU", nargs="?", default="CPU",
                        help="device (default CPU)")
    parser.add_argument("device_id", metavar="DEVICE_ID", nargs="?", type=int, default=0,
                        help="GPU id for GPU mode (default 0)")


def legacy_dims(shape: tuple[int, ...], blob: str) -> tuple[int, int, int, int]:
    """Caffe's num/channels/height/width of a blob of at most 4 axes (missing axes are 1)."""
    if not 1 <= len(shape) <= 4:
        raise NetError(f"blob {blob!r} has shape {list(shape)}; extract_features needs 1 to 4 "
                       "axes (Caffe's legacy num/channels/height/width)")
    dims = tuple(shape) + (1,) * (4 - len(shape))
    return dims[0], dims[1], dims[2], dims[3]


def feature_datum(values: np.ndarray, dims: tuple[int, int, int, int]):
    """The Datum Caffe writes for one item: float_data and the legacy C/H/W, no label."""

    datum = caffe_pb2.Datum(channels=dims[1], height=dims[2], width=dims[3])
    datum.float_data.extend(np.asarray(values, dtype=np.float32).ravel().tolist())
    return datum


def _device(mode: str, device_id: int):

    if mode.upper() == "GPU":
        device = select_device(caffe_pb2.SolverParameter(), device_from_flag(str(device_id)),
                               "GPU")
        log.info("Using GPU %d", device.index)
        return device
    if mode.upper() != "CPU":
        raise NetError(f"device mode: expected CPU or GPU, found {mode!r}")
    log.info("Using CPU")
    return CPU


def run(args) -> int:

    blobs, dbs = split_list(args.blobs), split_list(args.dbs)
    if len(blobs) != len(dbs):
        raise NetError(f"{len(blobs)} blob name(s) but {len(dbs)} database name(s); the "
                       "numbers must be equal")
    backend = backend_named(args.db_type, "DB_TYPE")
    if args.num_batches < 0:
        raise NetError(f"NUM_BATCHES: expected >= 0, found {args.num_batches}")
    net = Net(args.model, TEST, device=_device(args.mode, args.device_id), rules=layer_rules())
    net.copy_from(args.weights)
    for name in blobs:
        if name not in net.blobs:
            raise NetError(f"Unknown feature blob name {name} in the network {args.model}")
    writers = []
    try:
        for db in dbs:
            log.info("Opening dataset %s", db)
            writers.append(open_writer(db, backend))
        log.info("Extracting Features")
        for _ in range(args.num_batches):
            net.forward()
            for name, writer in zip(blobs, writers):
                data = to_host(net.blobs[name].data)
                dims = legacy_dims(data.shape, name)
                for item in data.reshape(dims[0], -1):
                    writer.put(f"{writer.count:010d}", feature_datum(item, dims))
                    if writer.count % 1000 == 0:
                        log.info("Extracted features of %d query images for feature blob %s",
                                 writer.count, name)
    except BaseException:
        for writer in writers:
            writer.abort()
        raise
    for name, writer in zip(blobs, writers):
        writer.close()
        log.info("Extracted features of %d query images for feature blob %s",
                 writer.count, name)
    log.info("Successfully extracted the features!")
    return 0
