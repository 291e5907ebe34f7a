"""`python -m mgcaffe` runs the command-line program."""

import sys

from .cli import main

sys.exit(main())
