"""Sub-commands of the `mgcaffe` program, one module each.

A command module defines NAME (the sub-command), HELP (one line), `add_arguments(parser)` and
`run(args) -> int` (the exit status). Every module in this package is discovered by cli.py.
"""
