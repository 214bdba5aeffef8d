"""Bounds on what users hand the tool: the files it reads, the YAML documents in them, and the input
its messages quote back.

**Files.** Every file a user or the model store provides (a trace, a scenario, a scaler manifest, a
model's ``model.json`` and ``manifest.json``, the serving pointer) is opened by :func:`open_regular`
or :func:`read_regular`: stat first, so a device is never opened at all; then open without blocking
(``O_NONBLOCK``: a FIFO with no writer would otherwise hang the command for ever) and check the
opened file again with ``fstat``, so what is read is the regular file that was checked even if the
path is swapped in between; and refuse a file over its size limit before a byte of it is read.

**YAML.** ``yaml.safe_load`` builds aliases by reference, so a few hundred bytes of anchors ("billion
laughs") make a document whose expanded size is astronomical: harmless until something walks or
prints it — an error message quoting it, a ``str()`` of a list — and then it hangs. Such documents,
and ones nested deeper than any real file, are refused right after parsing (:func:`check_size`).

**Messages** quote input through :func:`excerpt`, which keeps a few dozen characters: an error that
echoed a 5 MB cell back would bury what it says under the input it refuses.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, Any

from predictive_scaler.errors import ConfigError, ScalerError

#: Values (scalars, list items, keys) a document may hold once its aliases are expanded.
MAX_VALUES = 100_000
#: Nesting a document may have (a real manifest has fewer than 15 levels).
MAX_DEPTH = 64

#: Characters of an input value a message quotes; the rest is elided with its length.
EXCERPT_CHARS = 80
#: A link's target is a path, quoted whole as paths are up to this length.
LINK_CHARS = 400

#: A scenario or scaler-manifest YAML file. The bundled scenarios are 1–3 KB and a PredictiveScaler
#: manifest 1–2 KB, so this holds hundreds of manifests in one ``retrain --config``; PyYAML (pure
#: Python) takes several seconds to parse a dense megabyte, so a bigger bound would let a wrong file
#: stall the command long before MAX_VALUES could refuse it.
MAX_YAML_BYTES = 1 << 20
YAML_BYTES_ENV = "PREDICTIVE_SCALER_MAX_YAML_BYTES"
#: A trace file. The biggest bundled trace is 2.1 MB (62 days at one minute); a trace's grid holds at
#: most 10 million steps (series.MAX_GRID_STEPS), which as CSV rows of ~30–45 bytes is 300–450 MB —
#: so every trace that could be accepted fits, and a 2 GB file is refused before it is read into memory.
MAX_TRACE_BYTES = 512 << 20
TRACE_BYTES_ENV = "PREDICTIVE_SCALER_MAX_TRACE_BYTES"
#: A trace row (or cell) is a timestamp and a number: under 60 bytes in every real export. A longer
#: line is not a trace row — and parsing a multi-megabyte "timestamp" takes minutes — so it is refused
#: while the file is scanned, before pandas sees it.
MAX_TRACE_LINE_BYTES = 4096

#: Makes the error a refusal raises from its message (e.g. ``DataError``, or ``ConfigError`` with a field).
Refusal = Callable[[str], ScalerError]


# -- messages --------------------------------------------------------------------------------------

def excerpt(value: object, width: int = EXCERPT_CHARS) -> str:
    """``repr(value)`` for a message, cut after ``width`` characters with an ellipsis and the full length.

    A string is cut before it is repr'd, so quoting a 5 MB cell costs nothing."""
    if isinstance(value, str):
        if len(value) <= width:
            return repr(value)
        head = repr(value[:width])
        return f"{head[:-1]}…{head[-1]} ({len(value):,} characters)"
    text = repr(value)
    return text if len(text) <= width else f"{text[:width]}… ({len(text):,} characters)"


def size_text(n: int) -> str:
    """``n`` bytes for a reader: 512 MiB, 2.0 GiB, 900 bytes."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            value = n / (1 << shift)
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} bytes"


_SIZE = re.compile(r"^\s*(\d+)\s*(?:([kmgt])(?:i?b)?)?\s*$", re.IGNORECASE)


def byte_limit(env: str, default: int) -> int:
    """The size limit the environment variable ``env`` sets (bytes, or with KiB/MiB/GiB), else ``default``."""
    raw = os.environ.get(env, "")
    if not raw.strip():
        return default
    m = _SIZE.match(raw)
    value = 0
    if m is not None:
        value = int(m.group(1)) << (10 * " kmgt".index(m.group(2).lower()) if m.group(2) else 0)
    if value <= 0:
        raise ConfigError(f"{env}={excerpt(raw)} is not a size; write a number of bytes, e.g. {env}=1073741824 "
                          f"or {env}=1GiB (the default is {size_text(default)})", field=env)
    return value


# -- files -----------------------------------------------------------------------------------------

def kind_of(mode: int) -> str:
    """What a file of ``mode`` is, as a message says it: "a FIFO (named pipe)", "a directory" …"""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "not a regular file"


def describe(path: str | Path) -> str | None:
    """What is at ``path`` without following a link ("a symbolic link to '/dev/zero'"); None: nothing."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        target = _link_target(path)
        return "a symbolic link" + (f" to {target}" if target else "")
    return kind_of(st.st_mode)


def _link_target(path: str | Path) -> str | None:
    try:
        return excerpt(os.readlink(path), LINK_CHARS)
    except OSError:
        return None


def _not_regular(p: Path, mode: int, remedy: str, error: Refusal) -> ScalerError:
    if stat.S_ISLNK(mode):
        kind = describe(p) or kind_of(mode)
    elif os.path.islink(p):
        kind = f"{kind_of(mode)} (through a symbolic link to {_link_target(p)})"
    else:
        kind = kind_of(mode)
    return error(f"{p}: is {kind}, not a regular file; {remedy}")


def _open_failed(p: Path, exc: OSError, *, remedy: str, error: Refusal, unreadable: Refusal,
                 missing: str | None) -> ScalerError:
    if exc.errno == errno.ENOENT:
        return error(f"{p}: {missing or 'no such file'}; {remedy}")
    if exc.errno == errno.ELOOP and os.path.islink(p):
        return error(f"{p}: is {describe(p)}, not a regular file; {remedy}")
    if exc.errno == errno.EISDIR:
        return error(f"{p}: is a directory, not a regular file; {remedy}")
    return unreadable(f"{p}: cannot be read ({exc.strerror or exc}); check the path, its permissions and the "
                      "volume it is on")


@contextlib.contextmanager
def open_regular(path: str | Path, *, what: str, remedy: str, error: Refusal, unreadable: Refusal | None = None,
                 max_bytes: int | None = None, too_big: str | None = None, follow_symlinks: bool = True,
                 missing: str | None = None) -> Iterator[IO[bytes]]:
    """``path`` opened for reading in binary, once it is known to be a regular file of at most ``max_bytes``.

    Refusals are ``error(message)``: the path, what is wrong (``is a FIFO (named pipe), not a regular
    file``; ``is 2,147,483,648 bytes (2 GiB), over the …-byte limit``; ``missing``, else ``no such
    file``) and ``remedy`` (``too_big`` for a file over the limit). An OS error other than those (no
    permission, an I/O error) is ``unreadable(message)`` (default ``error``). ``follow_symlinks=False``
    refuses a symbolic link itself (the model store never writes one). ``what`` names the file in the
    size message ("a trace").
    """
    p = Path(path)
    fail = partial(_open_failed, p, remedy=remedy, error=error, unreadable=unreadable or error, missing=missing)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        # Stat first, so a device is never opened (opening some has effects of its own); the fstat of
        # the open file below is what counts — the path may be swapped for a FIFO in between.
        mode = os.stat(p, follow_symlinks=follow_symlinks).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(p, mode, remedy, error)
        fd = os.open(p, flags)
    except OSError as exc:
        raise fail(exc) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(p, st.st_mode, remedy, error)
        if max_bytes is not None and st.st_size > max_bytes:
            raise error(f"{p}: is {st.st_size:,} bytes ({size_text(st.st_size)}), over the {max_bytes:,}-byte limit "
                        f"({size_text(max_bytes)}) for {what}; {too_big or remedy}")
        os.set_blocking(fd, True)  # a regular file: no effect on reads; the handle behaves as open() makes them
        fh = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with fh:
        try:
            yield fh
        except OSError as exc:  # a read failed (an I/O error of the volume)
            raise (unreadable or error)(f"{p}: cannot be read ({exc.strerror or exc}); check the volume it is on "
                                        "and run it again") from exc


def read_regular(path: str | Path, *, limit: int, what: str, remedy: str, error: Refusal,
                 unreadable: Refusal | None = None, too_big: str | None = None, follow_symlinks: bool = True,
                 missing: str | None = None) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (see :func:`open_regular`)."""
    with open_regular(path, what=what, remedy=remedy, error=error, unreadable=unreadable, max_bytes=limit,
                      too_big=too_big, follow_symlinks=follow_symlinks, missing=missing) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise error(f"{path}: the file grew past the {limit:,}-byte limit while being read; run it again")
    return data


def read_yaml_text(path: str | Path, *, what: str, remedy: str, field: str) -> str:
    """The text of a user's YAML file (a scenario, scaler manifests): a regular file of at most
    MAX_YAML_BYTES (``PREDICTIVE_SCALER_MAX_YAML_BYTES`` raises it). Refusals are ConfigErrors on
    ``field``; text that is not UTF-8 raises UnicodeDecodeError, which the caller words."""
    limit = byte_limit(YAML_BYTES_ENV, MAX_YAML_BYTES)
    refuse = partial(ConfigError, field=field)
    data = read_regular(path, limit=limit, what=what, remedy=remedy, error=refuse,
                        too_big=f"{what} is a few kilobytes: check that this is the right file, or raise the limit "
                                f"with {YAML_BYTES_ENV}=BYTES")
    return data.decode("utf-8")


@dataclass(frozen=True)
class LineScan:
    """What :func:`scan_lines` saw: ``lines`` (all of them, unless it stopped early) and the first line
    longer than allowed (``long_line``, 1-based; None when there is none) with its length so far."""

    lines: int
    long_line: int | None = None
    long_bytes: int = 0


def scan_lines(fh: IO[bytes], *, max_lines: int, max_line_bytes: int, block: int = 1 << 20) -> LineScan:
    """Count the lines of ``fh`` from where it stands, a block at a time (memory stays at a few blocks),
    stopping as soon as there are more than ``max_lines`` or one is longer than ``max_line_bytes``."""
    import numpy as np  # the line lengths of a block at C speed: millions of rows take a fraction of a second

    lines = 0  # complete lines so far
    current = 0  # bytes of the line in progress
    while data := fh.read(block):
        ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 0x0A)
        if ends.size:
            lengths = np.diff(ends, prepend=-1) - 1  # of each line ending in this block, its newline excluded
            lengths[0] += current
            over = np.flatnonzero(lengths > max_line_bytes)
            if over.size:
                i = int(over[0])
                return LineScan(lines + i + 1, lines + i + 1, int(lengths[i]))
            lines += int(ends.size)
            current = len(data) - int(ends[-1]) - 1
        else:
            current += len(data)
        if current > max_line_bytes:
            return LineScan(lines + 1, lines + 1, current)
        if lines > max_lines:
            return LineScan(lines)
    return LineScan(lines + (1 if current else 0))


# -- YAML documents --------------------------------------------------------------------------------

def check_size(doc: Any, where: str, *, field: str | None = None) -> Any:
    """``doc`` unchanged, or ConfigError when its aliases expand past MAX_VALUES or it nests past MAX_DEPTH."""
    memo: dict[int, int] = {}

    def size(node: Any, depth: int) -> int:
        if depth > MAX_DEPTH:
            raise ConfigError(f"{where}: nested more than {MAX_DEPTH} levels deep; this is not a file this tool "
                              "reads — check that it is the right one", field=field)
        if not isinstance(node, dict | list):
            return 1
        key = id(node)
        if key not in memo:
            children = [*node.keys(), *node.values()] if isinstance(node, dict) else node
            memo[key] = 1 + sum(size(child, depth + 1) for child in children)
        return memo[key]

    total = size(doc, 0)
    if total > MAX_VALUES:
        raise ConfigError(f"{where}: its YAML aliases expand to {total:,} values (more than {MAX_VALUES:,}); write "
                          "the settings out without anchors (&) and aliases (*)", field=field)
    return doc
