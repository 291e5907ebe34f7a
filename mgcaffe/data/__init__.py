"""Caffe's data formats and pipeline on the host: Datum records, LMDB and LevelDB, transforms,
prefetch.

Everything here runs on numpy (and Pillow for images) in the data layers' prefetch threads;
the data layers in `mgcaffe.layer_types` copy each finished batch to the device once.
"""

from .datum import array_to_datum, datum_to_array, parse_datum
from .db import DBReader, LMDBReader, open_db
from .prefetch import Prefetcher
from .transformer import DataTransformer

__all__ = [
    "DBReader", "DataTransformer", "LMDBReader", "Prefetcher",
    "array_to_datum", "datum_to_array", "open_db", "parse_datum",
]
