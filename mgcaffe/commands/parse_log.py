"""`mgcaffe parse_log LOG OUTDIR`: a training log as two CSV tables, LOG.train and LOG.test.

The tables Caffe's tools/extra/parse_log.py writes, row for row: columns NumIters, Seconds
(since the log's `Solving` line), LearningRate (the last `lr = ` seen; the first row takes
the second row's), then one column per net output (`Train net output #i: name = v`, `Test
net output ...`). Rows are cut the way that script cuts them: a row is complete once it has
as many columns as the first row, or when an output of a later iteration starts the next
row (so a trailing incomplete row is not written). Lines before the first `Iteration N` are
ignored; the glog heads give the time (their year is the log file's, rolling over when the
month goes back). A table with no rows is not written.
"""

from __future__ import annotations

import csv
import datetime
import logging
import math
import os
import re

from ..errors import MgcaffeError

NAME = "parse_log"
HELP = "turn a training log into LOG.train / LOG.test CSV tables (Caffe's parse_log.py)"

log = logging.getLogger("mgcaffe.commands.parse_log")

_ITERATION = re.compile(r"Iteration (\d+)")
_TRAIN_OUTPUT = re.compile(r"Train net output #(\d+): (\S+) = ([\.\deE+-]+)")
_TEST_OUTPUT = re.compile(r"Test net output #(\d+): (\S+) = ([\.\deE+-]+)")
_LEARNING_RATE = re.compile(r"lr = ([-+]?[0-9]*\.?[0-9]+(?:[eE]?[-+]?[0-9]+)?)")
_GLOG_HEAD = re.compile(r"^\s*[IWEF](\d\d)(\d\d) (\d+):(\d+):(\d+)\.(\d+)\s")


def add_arguments(parser) -> None:
    parser.add_argument("logfile", metavar="LOG", help="the training log")
    parser.add_argument("output_dir", metavar="OUTDIR", help="where LOG.train/LOG.test go")
    parser.add_argument("--delimiter", default=",", help="column delimiter (default ',')")
    parser.add_argument("--verbose", action="store_true", help="log each file written")


def _line_time(line: str, year: int) -> datetime.datetime | None:
    match = _GLOG_HEAD.match(line)
    if not match:
        return None
    month, day, hour, minute, second, micro = (int(g) for g in match.groups())
    try:
        return datetime.datetime(year, month, day, hour, minute, second, micro)
    except ValueError:
        return None


class _Table:
    """Rows of one table, cut as parse_log.py cuts them."""

    def __init__(self, pattern: re.Pattern):
        self.pattern = pattern
        self.rows: list[dict] = []
        self.row: dict | None = None

    def feed(self, line: str, iteration: float, seconds: float, lr: float) -> None:
        match = self.pattern.search(line)
        if match:
            if self.row is None or self.row["NumIters"] != iteration:
                if self.row is not None:
                    self.rows.append(self.row)
                self.row = {"NumIters": iteration, "Seconds": seconds, "LearningRate": lr}
            self.row[match.group(2)] = float(match.group(3))
        if self.row is not None and self.rows and len(self.row) == len(self.rows[0]):
            self.rows.append(self.row)
            self.row = None

    def finish(self) -> list[dict]:
        if len(self.rows) > 1:
            self.rows[0]["LearningRate"] = self.rows[1]["LearningRate"]
        return self.rows


def parse_log(path: str) -> tuple[list[dict], list[dict]]:
    """(train rows, test rows) of the log at `path`, each row a dict in column order."""
    try:
        year = datetime.datetime.fromtimestamp(os.path.getctime(path)).year
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError as exc:
        raise MgcaffeError(f"{path}: cannot read: {exc.strerror}") from None
    start_index = next((i for i, line in enumerate(lines) if "Solving" in line), None)
    start = _line_time(lines[start_index], year) if start_index is not None else None
    if start is None:
        raise MgcaffeError(f"{path}: no glog-stamped 'Solving ...' line; expected a training "
                           "log of `caffe train` or `mgcaffe train`")
    train, test = _Table(_TRAIN_OUTPUT), _Table(_TEST_OUTPUT)
    iteration, lr, last = -1.0, math.nan, start
    for line in lines[start_index + 1:]:
        match = _ITERATION.search(line)
        if match:
            iteration = float(match.group(1))
        if iteration == -1:
            continue
        when = _line_time(line, year)
        if when is None:
            continue  # no glog head (e.g. the text of a multi-line message)
        if when.month < last.month:
            year += 1
            when = _line_time(line, year)
        last = when
        seconds = (when - start).total_seconds()
        match = _LEARNING_RATE.search(line)
        if match:
            lr = float(match.group(1))
        train.feed(line, iteration, seconds, lr)
        test.feed(line, iteration, seconds, lr)
    return train.finish(), test.finish()


def write_table(path: str, rows: list[dict], delimiter: str = ",") -> bool:
    """Write `rows` as CSV (excel dialect, header first); False (nothing written) if empty."""
    if not rows:
        return False
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]), dialect=csv.excel,
                                delimiter=delimiter)
        writer.writeheader()
        try:
            writer.writerows(rows)
        except ValueError as exc:  # a later row has a column the first row lacks
            raise MgcaffeError(f"{path}: {exc}; the first row of the table is incomplete") \
                from None
    return True


def run(args) -> int:
    train, test = parse_log(args.logfile)
    os.makedirs(args.output_dir, exist_ok=True)
    base = os.path.join(args.output_dir, os.path.basename(args.logfile))
    for suffix, rows in ((".train", train), (".test", test)):
        if write_table(base + suffix, rows, args.delimiter):
            if args.verbose:
                log.info("Wrote %s", base + suffix)
        elif args.verbose:
            log.info("Not writing %s; no lines to write", base + suffix)
    return 0
