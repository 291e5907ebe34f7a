"""`mgcaffe convert_db`: copy a Datum database into a new one of the other backend.

    mgcaffe convert_db [-backend lmdb|leveldb] INPUT_DB OUTPUT_DB

Not one of Caffe's tools: the way from a LevelDB (Caffe's default backend, which one
process at a time may open) to an LMDB, which the ranks of a distributed job on one node
read at once. Every record is copied as it is (key and value bytes), in key order, so a
Data layer reads the new database exactly as it read the old one; `-backend` names the
output's backend (default lmdb), the input's is what its files are. OUTPUT_DB must not
exist; it appears whole or not at all.
"""

from __future__ import annotations

import logging

from ..data.convert import write_records
from ..data.db import backend_named, iter_records

NAME = "convert_db"
HELP = "copy a Datum LevelDB into a new LMDB (or an LMDB into a LevelDB), record for record"

log = logging.getLogger("mgcaffe.commands.convert_db")


def add_arguments(parser) -> None:
    parser.add_argument("--backend", default="lmdb",
                        help="the output's database type: lmdb (default) or leveldb")
    parser.add_argument("input_db", metavar="INPUT_DB")
    parser.add_argument("output_db", metavar="OUTPUT_DB")


def run(args) -> int:

    backend = backend_named(args.backend)

    def records():
        for count, record in enumerate(iter_records(args.input_db), 1):
            if count % 10000 == 0:
                log.info("Processed %d records.", count)
            yield record

    count = write_records(args.output_db, records(), backend=backend)
    log.info("Copied %d records from %s to %s (%s).", count, args.input_db, args.output_db,
             args.backend.lower())
    return 0
