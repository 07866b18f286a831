"""CSV sources read one record per physical line (``dpsql.engine.duckdb``).

A CSV source's records are its lines ending in ``\\n`` (``\\r\\n`` too): quotes never span a
line or hide a delimiter, so one line, one person's row, never swallows or splits the lines of
others (``dpsql.engine._duckdb_sources``). DuckDB's CSV reader (and Arrow's) also ends a record
at a lone carriage return (``\\r`` not followed by ``\\n``), with no option to stop it: a person's
free-text field holding ``\\r900,x,100`` would add a row attributed to person 900, so one
person's data could move the contributions of others without bound.

So DuckDB never reads the owner's file itself: before the first private read of each file
version, the engine writes a copy in a directory of its own where every ``\\r\\n`` is ``\\n`` and
every other ``\\r`` is a space (a ``.gz`` file is decompressed into the copy), streamed in
chunks, and the source's view reads the copies with the same options. A lone carriage return
is then one byte of its own field, in its own line. The copy's cost is a function of the file's
size (one read and one write), paid once per file version in a process (a file modified less
than ``SETTLE_SECONDS`` before is copied again at every read: file times are coarse). The file
version is ``(device, inode, size, mtime, ctime)``, checked before the copy, after it and after
the read: a change in between makes the read the one generic failure (its charge stands), a
function of the owner's files, never of a cell.

The copy is also where the file's text is decoded (engine setting ``csv_encoding``): into UTF-8
from Latin-1, or, for UTF-8, a line that is not valid UTF-8 is left out of the copy. DuckDB's reader
(with ``ignore_errors``) dropped such a line only when a query read one of its text columns, so
``COUNT(*)`` and ``COUNT(name)`` of one file disagreed; decided here, a line is kept or skipped
alike for every query, by its own bytes only.

The copy runs under the owner's ``statement_timeout`` like the query itself (checked at every
chunk: DuckDB's interrupt reaches only a running statement), so the time-out, with
``min_response_time`` above it, still bounds and hides how long a read takes: without the check
a file made larger by one person (a 300 MB field: 0.8 s of copy) answered after the time-out.

The copies are plaintext private data: their directory (mode 0700, files 0600) is under the
owner's ``temp_directory`` when set, removed when the engine closes, when it is garbage
collected, or when the process exits normally with the engine still open (not after SIGKILL or
a signal that ends the process without Python's exit handlers). A failed copy leaves none
behind; copies removed meanwhile (a cleaner of temporary files) are made again.
"""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from time import monotonic as now
from typing import Any

from dpsql.engine._duckdb_native import Version, settled, versions

#: bytes per chunk of the copy
_CHUNK = 1 << 22
#: a line longer than this is left out of the copy (DuckDB's reader skips lines over 2 MiB)
_LONG_LINE = 1 << 23


@dataclass
class CsvSource:
    """A registered CSV source: its files and how its view is built over (copies of) them."""

    name: str
    source: str
    types: dict[str, str]
    paths: list[str]
    version: Version | None = None  # the files' version the current copies were made from
    copies: list[str] = field(default_factory=list)


def clean_copy(path: str, out_dir: str, suffix: str, until: float | None = None, encoding: str = "utf-8") -> str:
    """Copy ``path`` into ``out_dir`` with ``\\r\\n`` as ``\\n`` and any other ``\\r`` as a space, as
    UTF-8 text decoded from ``encoding`` (UTF-8: a line that is not valid UTF-8 is left out, and so
    is a line over :data:`_LONG_LINE` bytes, which DuckDB's reader skips too); TimeoutError (an
    OSError: the generic failure) once :func:`now` passes ``until``, the statement time-out's
    deadline, checked at every chunk."""
    opener: Any = gzip.open if path.lower().endswith(".gz") else open
    fd, out = tempfile.mkstemp(dir=out_dir, suffix=suffix)
    try:
        with opener(path, "rb") as src, os.fdopen(fd, "wb") as dst:
            pending = b""  # an unfinished line (whole lines are cleaned: a \r\n is never split)
            dropping = False  # the unfinished line is over _LONG_LINE bytes: left out up to its \n
            while True:
                chunk = src.read(_CHUNK)
                if not chunk:
                    break
                if until is not None and now() > until:
                    raise TimeoutError("the copy of a CSV file ran past the statement time-out")
                data = pending + chunk
                cut = data.rfind(b"\n") + 1
                lines, pending = data[:cut], data[cut:]
                if dropping:
                    if not cut:
                        pending = b""
                        continue
                    lines, dropping = lines[lines.index(b"\n") + 1:], False
                if len(pending) > _LONG_LINE:
                    pending, dropping = b"", True
                dst.write(_clean(lines, encoding))
            if pending and not dropping:
                dst.write(_clean(pending, encoding))
    except BaseException:
        try:
            os.unlink(out)
        except OSError:
            pass
        raise
    return out


def _clean(lines: bytes, encoding: str) -> bytes:
    """Whole lines (the last may lack its \\n) cleaned and decoded as :func:`clean_copy` says."""
    lines = lines.replace(b"\r\n", b"\n").replace(b"\r", b" ")
    if encoding != "utf-8":
        return lines.decode(encoding).encode("utf-8")
    try:
        lines.decode("utf-8")
        return lines
    except UnicodeDecodeError:  # the line(s) holding the invalid bytes, and no other, are left out
        return _valid_lines(lines)


def _valid_lines(lines: bytes) -> bytes:
    """The lines of ``lines`` (each with its \\n; the last may lack it) that are UTF-8, found for every line at
    once (:func:`dpsql.engine._duckdb_native.invalid_mask`: steps of lines validated in C++, numpy passes only
    over a step that fails), so an invalid line costs the work of its step, and there is no Python work per line
    (decoding each line of such a chunk in Python made one person's 20 invalid lines cost a 75 MB file's
    copy 3.5 CPU s against 1.1 s)."""
    import numpy as np
    import pyarrow as pa

    from dpsql.engine._duckdb_native import invalid_mask

    data = np.frombuffer(lines, np.uint8)
    ends = np.flatnonzero(data == 10) + 1
    if not len(ends) or ends[-1] != len(data):
        ends = np.concatenate([ends, [len(data)]])
    offsets = np.concatenate([[0], ends]).astype(np.int64)
    values = pa.Array.from_buffers(pa.large_binary(), len(ends), [None, pa.py_buffer(offsets), pa.py_buffer(lines)])
    keep = np.repeat(~invalid_mask(values), np.diff(offsets))
    return data[keep].tobytes()


def refresh(src: CsvSource, out_dir: str, suffix: str, until: float | None = None,
            encoding: str = "utf-8") -> tuple[bool, Version]:
    """Make ``src.copies`` hold the files' current version; returns whether the copies are new and
    the version they hold. OSError if a file is missing or changes during the copy."""
    version = versions(src.paths)
    if src.version == version and settled(version) and all(os.path.exists(c) for c in src.copies):
        return False, version  # (copies removed by a cleaner of temporary files are made again)
    copies: list[str] = []
    try:  # a failed copy leaves none behind (else one more full copy per failed read)
        for p in src.paths:
            copies.append(clean_copy(p, out_dir, suffix, until, encoding))
        if versions(src.paths) != version:
            raise OSError("a source file changed while it was copied")
    except BaseException:
        for c in copies:
            _remove(c)
        raise
    old, src.copies, src.version = src.copies, copies, version
    for c in old:
        _remove(c)
    return True, version


def drop(src: CsvSource) -> None:
    for c in src.copies:
        _remove(c)
    src.copies, src.version = [], None


def make_dir(parent: str | None) -> str:
    """A directory of the engine's own (mode 0700) for the copies: under the owner's
    ``temp_directory`` when set (where the engine writes temporary data), else the system's."""
    if parent is not None:
        os.makedirs(parent, mode=0o700, exist_ok=True)
    return tempfile.mkdtemp(prefix=f"dpsql-csv-{os.getpid()}-", dir=parent)


def remove_dir(path: str | None, pid: int | None = None) -> None:
    """Remove the copies' directory; with ``pid``, only in that process (a forked child ending
    normally runs its parent's exit handlers, and must not take the parent's copies)."""
    if path is not None and (pid is None or os.getpid() == pid):
        shutil.rmtree(path, ignore_errors=True)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
