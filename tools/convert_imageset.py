"""Caffe's convert_imageset as a script: `mgcaffe convert_imageset` under another name.

    python tools/convert_imageset.py [FLAGS] ROOTFOLDER/ LISTFILE DB_NAME

See mgcaffe/commands/convert_imageset.py for the flags.
"""

from __future__ import annotations

import sys

from mgcaffe.cli import main as mgcaffe_main


def main(argv=None) -> int:
    """Run `mgcaffe convert_imageset ARGV...`; returns the exit status."""
    return mgcaffe_main(["convert_imageset", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
