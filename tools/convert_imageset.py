"""Caffe's convert_imageset: images named in a list file -> an LMDB of Datum records.

    python tools/convert_imageset.py [flags] ROOTFOLDER/ LISTFILE DB_NAME

LISTFILE lines are `path label` (the label follows the last space); images are read from
ROOTFOLDER + path (plain concatenation, as Caffe). Keys are `%08d_path` in list order (after
--shuffle), so the Data layer reads them in that order. Flags keep Caffe's names and accept
one or two dashes: --gray, --shuffle, --backend lmdb, --resize_width, --resize_height,
--check_size, --encoded, --encode_type; --seed fixes the shuffle. Images that cannot be read
are skipped with a warning, as Caffe does.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from mgcaffe.data.convert import write_records
from mgcaffe.data.datum import array_to_datum, encoded_datum
from mgcaffe.data.image import decode_image, encode_image
from mgcaffe.errors import DataError, MgcaffeError
from mgcaffe.layer_types.image_data import read_image_list


def _flag(parser, name, **kw):
    parser.add_argument(f"--{name}", f"-{name}", **kw)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _flag(parser, "gray", action="store_true", help="read images as grey (1 channel)")
    _flag(parser, "shuffle", action="store_true", help="shuffle the list before writing")
    _flag(parser, "seed", type=int, default=0, help="shuffle seed (default %(default)s)")
    _flag(parser, "backend", default="lmdb", help="only lmdb is supported")
    _flag(parser, "resize_width", type=int, default=0, help="resize to this width (0: keep)")
    _flag(parser, "resize_height", type=int, default=0, help="resize to this height")
    _flag(parser, "check_size", action="store_true", help="require equal image sizes")
    _flag(parser, "encoded", action="store_true", help="store encoded images (JPEG/PNG)")
    _flag(parser, "encode_type", default="", help="encoding: png, jpg, ... (default: the "
          "file's extension)")
    parser.add_argument("root_folder")
    parser.add_argument("list_file")
    parser.add_argument("db_name")
    return parser.parse_args(argv)


def _extension(path: str) -> str:
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    return "jpg" if ext == "jpeg" else ext


def make_datum(path: str, label: int, args, what: str):
    """The Datum for one image; keeps an encoded file's own bytes when nothing changes."""
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
    """Write the database; returns (records written, images skipped)."""
    if args.backend.lower() != "lmdb":
        raise DataError(f"--backend {args.backend}: only lmdb is supported")
    lines = read_image_list(args.list_file, "convert_imageset")
    if args.shuffle:
        order = np.random.RandomState(args.seed).permutation(len(lines))
        lines = [lines[i] for i in order]
    skipped, first_shape = [0], [None]

    def records():
        for line_id, (name, label, number) in enumerate(lines):
            what = f"image {args.root_folder + name!r} (list {args.list_file!r} line {number})"
            try:
                datum, shape = make_datum(args.root_folder + name, label, args, what)
            except DataError as exc:
                print(f"warning: {exc}; skipped", file=sys.stderr)
                skipped[0] += 1
                continue
            if args.check_size:
                if first_shape[0] is None:
                    first_shape[0] = shape
                elif shape != first_shape[0]:
                    raise DataError(f"{what} is {'x'.join(map(str, shape))}, expected "
                                    f"{'x'.join(map(str, first_shape[0]))} (--check_size)")
            yield f"{line_id:08d}_{name}", datum

    return write_records(args.db_name, records()), skipped[0]


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        count, skipped = convert(args)
    except MgcaffeError as exc:
        print(f"convert_imageset: {exc}", file=sys.stderr)
        return 1
    print(f"Processed {count} files into {args.db_name}" +
          (f" ({skipped} unreadable, skipped)" if skipped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
