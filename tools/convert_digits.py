"""Write scikit-learn's bundled handwritten digits into Caffe Datum LMDBs (the demo's data).

    python tools/convert_digits.py --out data/digits [--force]

Writes under OUT:
    digits_train_lmdb/        1,437 records     digits_test_lmdb/   360 records
    digits_mean.binaryproto   the mean training image (1x1x8x8 float)

Data: `sklearn.datasets.load_digits()` (1,797 real 8x8 grey images, values 0..16, labels
0..9). Each record is a raw Datum: channels 1, height 8, width 8, uint8 pixels value*255//16
(so 16 -> 255), and the label.

Split, fixed and reproducible with numpy's frozen legacy RandomState(SEED): for each class
0..9 in turn, that class's indices (in load_digits order) are permuted and the first 36 go
to the test set, the rest to the training set (36 x 10 = 360 test images, every class
equally represented); then each set is permuted as a whole so that consecutive records mix
the classes (Caffe's Data layer reads in key order, no shuffle). Keys are the record number
zero-padded to 8 digits, so key order is record order.

Idempotent: nothing is written when all outputs exist, unless --force.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from mgcaffe.data.convert import write_lmdb
from mgcaffe.data.datum import array_to_datum
from mgcaffe.formats.protoio import write_binaryproto

SEED = 1797
TEST_PER_CLASS = 36
TRAIN_DB, TEST_DB, MEAN_FILE = "digits_train_lmdb", "digits_test_lmdb", "digits_mean.binaryproto"


def load_digits_uint8() -> tuple[np.ndarray, np.ndarray]:
    """(images as N x 1 x 8 x 8 uint8 scaled to 0..255, labels as N ints)."""
    from sklearn.datasets import load_digits  # noqa: PLC0415 - a dev dependency, only here

    digits = load_digits()
    values = np.rint(digits.images).astype(np.int64)  # stored as floats 0.0 .. 16.0
    pixels = (values * 255 // 16).astype(np.uint8)
    return pixels[:, None, :, :], digits.target.astype(np.int64)


def split(labels: np.ndarray, seed: int = SEED,
          test_per_class: int = TEST_PER_CLASS) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, test indices) in record order; see the module docstring."""
    rs = np.random.RandomState(seed)
    train, test = [], []
    for c in np.unique(labels):
        members = rs.permutation(np.flatnonzero(labels == c))
        test.extend(members[:test_per_class])
        train.extend(members[test_per_class:])
    return rs.permutation(np.asarray(train)), rs.permutation(np.asarray(test))


def convert(out, force: bool = False) -> tuple[int, int] | None:
    """Write the two LMDBs and the mean file under `out`; returns the (train, test) record
    counts, or None when skipped because they already exist."""
    out = Path(out)
    targets = [out / TRAIN_DB, out / TEST_DB, out / MEAN_FILE]
    if not force and all(t.exists() for t in targets):
        return None
    images, labels = load_digits_uint8()
    train, test = split(labels)
    out.mkdir(parents=True, exist_ok=True)
    for name, indices in ((TRAIN_DB, train), (TEST_DB, test)):
        write_lmdb(out / name, (array_to_datum(images[i], labels[i]) for i in indices),
                   overwrite=True)
    write_binaryproto(images[train].astype(np.float32).mean(axis=0, keepdims=True),
                      out / MEAN_FILE)
    return len(train), len(test)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data/digits", help="output folder (default %(default)s)")
    parser.add_argument("--force", action="store_true", help="rewrite outputs that exist")
    args = parser.parse_args(argv)
    counts = convert(args.out, args.force)
    if counts:
        print(f"wrote {args.out}/{TRAIN_DB} ({counts[0]} records), {args.out}/{TEST_DB} "
              f"({counts[1]} records) and {args.out}/{MEAN_FILE}")
    else:
        print(f"{args.out}: digits LMDBs already present; skipping (use --force to rewrite)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
