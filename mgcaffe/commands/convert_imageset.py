"""`mgcaffe convert_imageset`: images named in a list file -> an LMDB or LevelDB of Datums.

    mgcaffe convert_imageset [FLAGS] ROOTFOLDER/ LISTFILE DB_NAME

Caffe's tool, with its flags (gflags spellings too): -gray, -shuffle, -backend lmdb|leveldb,
-resize_width, -resize_height, -check_size, -encoded, -encode_type; -seed fixes the
shuffle. LISTFILE lines are `path label` (the label follows the last space); images are
read from ROOTFOLDER + path (plain concatenation, as Caffe). Keys are `%08d_path` in list
order (after -shuffle), so the Data layer reads them in that order. Images that cannot be
read are skipped with a warning, as Caffe does; a database that exists already is refused.
"""

from __future__ import annotations

import logging
import os

import numpy as np

from ..data.convert import write_records
from ..data.datum import array_to_datum, encoded_datum
from ..data.db import backend_named
from ..data.image import decode_image, encode_image
from ..errors import DataError
from ..layer_types.image_data import read_image_list
from ._flags import add_bool_flag

NAME = "convert_imageset"
HELP = ("convert a list of images to an LMDB or LevelDB of Datum records (Caffe's "
        "convert_imageset)")

log = logging.getLogger("mgcaffe.commands.convert_imageset")


def add_arguments(parser) -> None:
    add_bool_flag(parser, "gray", "read images as grey (1 channel)")
    add_bool_flag(parser, "shuffle", "shuffle the list before writing")
    parser.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    parser.add_argument("--backend", default="lmdb",
                        help="database type: lmdb (the default, as Caffe's) or leveldb")
    parser.add_argument("--resize_width", type=int, default=0, metavar="W",
                        help="resize images to this width (0: keep)")
    parser.add_argument("--resize_height", type=int, default=0, metavar="H",
                        help="resize images to this height (0: keep)")
    add_bool_flag(parser, "check_size", "require every image to have the same size")
    add_bool_flag(parser, "encoded", "store the images encoded (JPEG/PNG bytes)")
    parser.add_argument("--encode_type", default="", metavar="EXT",
                        help="encoding for -encoded: png, jpg, ... (default: the file's own)")
    parser.add_argument("root_folder", metavar="ROOTFOLDER/")
    parser.add_argument("list_file", metavar="LISTFILE")
    parser.add_argument("db_name", metavar="DB_NAME")


def _extension(path: str) -> str:
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    return "jpg" if ext == "jpeg" else ext


def make_datum(path: str, label: int, args, what: str):
    """(Datum, decoded CHW shape) for one image; an encoded Datum keeps the file's own bytes
    when nothing would change them (Caffe's ReadImageToDatum rule)."""

    color = not args.gray
    image = decode_image(path, color=color, new_height=args.resize_height,
                         new_width=args.resize_width, what=what)
    if not args.encoded:
        return array_to_datum(image, label), image.shape
    encoding = (args.encode_type or _extension(path)).lower()
    encoding = "jpg" if encoding == "jpeg" else encoding
    untouched = (not args.resize_height and not args.resize_width
                 and _extension(path) == encoding
                 and (decode_image(path, what=what).shape[0] == 3) == color)
    if untouched:
        with open(path, "rb") as f:
            return encoded_datum(f.read(), label), image.shape
    return encoded_datum(encode_image(image, "JPEG" if encoding == "jpg" else encoding),
                         label), image.shape


def convert(args) -> tuple[int, int]:
    """Write the database `args` describe; returns (records written, images skipped)."""

    backend = backend_named(args.backend)
    if args.resize_width < 0 or args.resize_height < 0:
        raise DataError("-resize_width/-resize_height: expected >= 0")
    lines = read_image_list(args.list_file, NAME)
    if args.shuffle:
        log.info("Shuffling data")
        order = np.random.RandomState(args.seed).permutation(len(lines))
        lines = [lines[i] for i in order]
    log.info("A total of %d images.", len(lines))
    skipped, first_shape, written = [0], [None], [0]

    def records():
        for line_id, (name, label, number) in enumerate(lines):
            what = f"image {args.root_folder + name!r} (list {args.list_file!r} line {number})"
            try:
                datum, shape = make_datum(args.root_folder + name, label, args, what)
            except DataError as exc:
                log.warning("%s; skipped", exc)
                skipped[0] += 1
                continue
            if args.check_size:
                if first_shape[0] is None:
                    first_shape[0] = shape
                elif shape != first_shape[0]:
                    raise DataError(f"{what} is {'x'.join(map(str, shape))}, expected "
                                    f"{'x'.join(map(str, first_shape[0]))} (-check_size)")
            written[0] += 1
            if written[0] % 1000 == 0:
                log.info("Processed %d files.", written[0])
            yield f"{line_id:08d}_{name}", datum

    count = write_records(args.db_name, records(), backend=backend)
    if count % 1000 != 0:
        log.info("Processed %d files.", count)
    return count, skipped[0]


def run(args) -> int:
    convert(args)
    return 0
