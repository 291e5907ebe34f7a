"""`mgcaffe compute_image_mean`: the mean image of a Datum LMDB or LevelDB, as a BlobProto.

    mgcaffe compute_image_mean [-backend lmdb|leveldb] INPUT_DB [OUTPUT_FILE]

Caffe's tool: every record (raw, float or encoded, decoded as stored) is added up and
divided by the count; OUTPUT_FILE, when given, gets a BlobProto with Caffe's legacy shape
fields num=1, channels, height, width (what `transform_param { mean_file }` reads, in
Caffe and mgcaffe). Each channel's mean is logged (`mean_value channel [c]: v`), the values
a `mean_value` list would take. Sums are kept in float64 (Caffe's float sum rounds on very
large databases).
"""

from __future__ import annotations

import logging

import numpy as np

from ..data.datum import datum_to_array, parse_datum
from ..data.db import backend_named, iter_records
from ..errors import DataError
from ..formats.protoio import array_to_blobproto, write_message

NAME = "compute_image_mean"
HELP = "compute the mean image of a Datum LMDB or LevelDB (Caffe's compute_image_mean)"

log = logging.getLogger("mgcaffe.commands.compute_image_mean")


def add_arguments(parser) -> None:
    parser.add_argument("--backend", default=None,
                        help="database type: lmdb or leveldb (default: what INPUT_DB is; "
                        "Caffe's default is lmdb)")
    parser.add_argument("input_db", metavar="INPUT_DB")
    parser.add_argument("output_file", metavar="OUTPUT_FILE", nargs="?",
                        help="the .binaryproto to write (optional)")


def image_mean(path, backend: int | None = None) -> np.ndarray:
    """The float32 CHW mean of every Datum in the database at `path` (`backend` None: LMDB
    or LevelDB, whichever the files are)."""

    total, count = None, 0
    for key, value in iter_records(path, backend):
        what = f"database {str(path)!r} key {key.decode(errors='replace')!r}"
        array = datum_to_array(parse_datum(value, what), color=None, what=what)
        if total is None:
            total = np.zeros(array.shape, np.float64)
        elif array.shape != total.shape:
            raise DataError(f"{what}: image is {'x'.join(map(str, array.shape))}, the first "
                            f"was {'x'.join(map(str, total.shape))}; all images need one size")
        total += array
        count += 1
        if count % 10000 == 0:
            log.info("Processed %d files.", count)
    if total is None:
        raise DataError(f"database {str(path)!r} has no records")
    if count % 10000 != 0:
        log.info("Processed %d files.", count)
    return (total / count).astype(np.float32)


def mean_blobproto(mean: np.ndarray):
    """A BlobProto of a CHW mean with num=1 and the legacy channels/height/width fields."""

    blob = array_to_blobproto(mean.astype(np.float32))
    blob.ClearField("shape")
    blob.num, (blob.channels, blob.height, blob.width) = 1, mean.shape
    return blob


def run(args) -> int:

    backend = backend_named(args.backend) if args.backend else None
    mean = image_mean(args.input_db, backend)
    if args.output_file:
        log.info("Write to %s", args.output_file)
        write_message(mean_blobproto(mean), args.output_file)
    log.info("Number of channels: %d", mean.shape[0])
    for c, value in enumerate(mean.reshape(mean.shape[0], -1).mean(axis=1, dtype=np.float64)):
        log.info("mean_value channel [%d]: %s", c, f"{value:g}")
    return 0
