"""Reading a JSON input file (a profile, a network description, a plan, a trace): one loader.

Every failure is one line naming the file: a missing or unreadable file, a FIFO or device
(refused: only regular files are read), a file beyond `MAX_JSON_BYTES`, bytes that are not
UTF-8 text, invalid JSON (with line and column and a short excerpt), nesting too deep for
the parser (Python's RecursionError).
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

from ..errors import MgcaffeError, ParseError

#: JSON inputs are small (a profile of a few thousand layers is ~1 MB); a bigger file is not one.
MAX_JSON_BYTES = 256 << 20
EXCERPT = 40


def read_json(path: str | os.PathLike, error: type[MgcaffeError] = ParseError,
              what: str = "JSON file") -> Any:
    """The parsed content of the JSON file `path`; failures raise `error` with one line."""
    if not os.path.exists(path):
        raise error(f"{path}: cannot read: no such file")
    data = read_regular_file(path, MAX_JSON_BYTES, error, what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not a UTF-8 text file (byte {exc.start} is "
                    f"0x{data[exc.start]:02x}); expected a {what}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{path}: invalid JSON, not a {what}: {exc.msg} (line {exc.lineno}, column "
                    f"{exc.colno}, near {excerpt(text, exc.pos)})") from None
    except RecursionError:
        raise error(f"{path}: JSON nested too deeply to be a {what}") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise error(f"{path}: invalid JSON, not a {what}: {short(str(exc))}") from None


def read_regular_file(path: str | os.PathLike, limit: int,
                      error: type[MgcaffeError] = ParseError, what: str = "file",
                      hint: str = "") -> bytes:
    """The bytes of a regular file of at most `limit` bytes; anything else is `error`.

    A FIFO, socket or device is refused without opening it for reading (a FIFO with no
    writer would block forever, /dev/zero never ends).
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{path}: is a directory; expected a {what}")
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{path}: not a regular file (a pipe, socket or device); expected a "
                    f"{what}")
    if st.st_size > limit:
        raise error(f"{path}: {st.st_size} bytes, more than the {limit} a {what} may have"
                    f"{hint}")
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > limit:  # grew while we looked
        raise error(f"{path}: more than the {limit} bytes a {what} may have{hint}")
    return data


def short(text: str, limit: int = 2 * EXCERPT) -> str:
    """`text` cut to about `limit` characters, with how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def excerpt(text: str, pos: int, width: int = EXCERPT) -> str:
    """A quoted excerpt of at most ~2*width characters of `text` around `pos`."""
    start, end = max(0, pos - width), min(len(text), pos + width)
    piece = text[start:end]
    return repr(("..." if start else "") + piece + ("..." if end < len(text) else ""))
