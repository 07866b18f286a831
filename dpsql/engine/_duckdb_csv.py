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
collected, or when the process exits normally with the engine still open. A process ended
without Python's exit handlers (SIGKILL, a crash) cannot remove them: each directory is locked by
its process for as long as it is in use (:func:`make_dir`), and the next engine, in any process,
to make a directory in the same place first removes those whose lock it can take, their process
being gone (:func:`sweep`). A failed copy leaves none behind; copies removed meanwhile (a cleaner
of temporary files) are made again.
"""

from __future__ import annotations

import atexit
import gzip
import os
import re
import secrets
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from time import monotonic as now
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no directory locks, no sweep (copies left by a killed process stay)
    fcntl = None  # type: ignore[assignment]

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


# -- the copies' directory: owned by its process through a lock, swept once that process is gone ------------
#
# Why a lock, and which. A directory of copies is in use while its process holds an exclusive
# ``flock`` on the directory itself (a descriptor of the directory kept open until the directory
# is removed). The kernel drops the lock when the process ends in any way, SIGKILL included, so
# "the lock can be taken" means "no process uses this directory any more". ``flock`` rather than
# ``fcntl`` record locks (``F_SETLK``/``lockf``), although those are not inherited through fork:
# a record lock never conflicts with a lock of the same process, so a sweep by a second engine of
# the process (or by the same engine through another spelling of the temp directory) would "take"
# the lock of a live directory of its own process and remove it, and closing any descriptor of
# the file drops the process's record locks. ``flock`` locks belong to the open file description
# and conflict between two descriptions even in one process, so a mistake in this process's
# bookkeeping can only leave a directory behind, never remove a live one. Their one drawback is
# that fork shares the description: a child would keep its parent's directory locked (so
# unswept) after the parent was killed. Hence the descriptor is opened ``O_CLOEXEC`` (gone at an
# exec) and the at-fork hook below closes it in a forked child (closing only: ``LOCK_UN`` on the
# shared description would unlock the parent's directory). A child forked without Python's
# at-fork hooks (a C library's own fork) keeps the lock until it ends: the directory is removed
# later, never early. (``systemd-tmpfiles`` documents that its age-based clean-up skips a
# directory locked this way, so its copies are not aged away while in use either.)
#
# Why the rename. A sweep must never remove a directory that a live process has just created
# and not yet locked. So a directory is created under a first name that no sweep matches
# (``tempfile.mkdtemp``'s ``dpsql-csv-<pid>-`` and 8 characters, the name of every copies'
# directory before the lock), locked, and only then renamed to its final name
# ``dpsql-csv-<pid>-`` and 16 hex digits (``_LOCKED``); the rename keeps the inode, hence the
# lock. A directory under a final name has therefore been locked since before it had that name,
# and taking its lock proves its process is gone: nothing can be in a final-named directory
# unlocked except after its process ended or while it removes it (a sweep then removes it too,
# or finds it gone). A process killed between the creation and the rename leaves an empty
# directory under the first name (no copy is written before the rename), which no sweep
# removes, as it does not remove directories of older versions of the engine or of a file
# system where ``flock`` fails (the directory then keeps its first name, unlocked, as before).
#
# The sweep opens each candidate with ``O_NOFOLLOW | O_DIRECTORY`` relative to a descriptor of
# the temp directory (a symlink, or anything but a directory, is left alone), keeps only
# directories of this user, checks after taking the lock that the name still names the locked
# directory, and removes it with ``shutil.rmtree`` relative to that descriptor (which never
# follows symlinks). It is best-effort: any failure skips the entry or ends the sweep, never the
# read, and nothing is logged (a directory's name says nothing of its rows, but there is nothing
# the owner must act on either).

#: the final name of a locked directory of the engine's: its copies of CSV files, or DuckDB's spill files (the sweep
#: removes nothing else)
_LOCKED = re.compile(r"dpsql-(?:csv|spill)-[0-9]+-[0-9a-f]{16}")
#: this process's copies' directories: path -> (the locked descriptor, st_dev, st_ino)
_OWN: dict[str, tuple[int, int, int]] = {}
_OWN_MUTEX = threading.Lock()


def _after_fork_in_child() -> None:
    # The parent's directories are its own (it removes them): the child closes its inherited
    # descriptors of them, so that the parent's locks end with the parent. Only the forking thread
    # exists in the child: the mutex is made anew (another thread may have held it at the fork).
    global _OWN_MUTEX
    _OWN_MUTEX = threading.Lock()
    for fd, _dev, _ino in _OWN.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _OWN.clear()


if fcntl is not None:
    os.register_at_fork(after_in_child=_after_fork_in_child)


def make_dir(parent: str | None, until: float | None = None, kind: str = "csv") -> str:
    """A directory of the engine's own (mode 0700) for the copies (``kind`` "csv"; "spill": DuckDB's spill files
    when the owner set no ``temp_directory``): under the owner's ``temp_directory`` when set (where the engine writes
    temporary data), else the system's. It is locked for as long as this process uses it, and the directories left
    in ``parent`` by processes that are gone are removed first (:func:`sweep`, stopped at ``until``)."""
    if parent is not None:
        os.makedirs(parent, mode=0o700, exist_ok=True)
    if fcntl is None:
        return tempfile.mkdtemp(prefix=f"dpsql-{kind}-{os.getpid()}-", dir=parent)
    sweep(tempfile.gettempdir() if parent is None else parent, until)  # (about 0.03 ms; 6 ms over 10 000 entries)
    first = tempfile.mkdtemp(prefix=f"dpsql-{kind}-{os.getpid()}-", dir=parent)
    final = os.path.join(os.path.dirname(first), f"dpsql-{kind}-{os.getpid()}-{secrets.token_hex(8)}")
    try:
        _lock_and_rename(first, final)
    except OSError:  # no lock on this file system (or the rename failed): unlocked, under the first name
        return first
    return final


def _lock_and_rename(first: str, final: str) -> None:
    """Lock the new directory ``first`` (this process's from now on: :data:`_OWN` under ``final``, before the rename,
    so that a sweep of this process skips it) and rename it ``final``; a rename onto a name taken meanwhile by another
    user's directory, a symlink or a file fails. On failure (``OSError``) nothing is held and what :data:`_OWN` held
    under ``final`` before is kept."""
    fd = os.open(first, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        st = os.fstat(fd)
        with _OWN_MUTEX:
            before = _OWN.get(final)
            _OWN[final] = (fd, st.st_dev, st.st_ino)
        try:
            os.rename(first, final)
        except BaseException:
            with _OWN_MUTEX:
                if _OWN.get(final, (None,))[0] == fd:
                    if before is None:
                        del _OWN[final]
                    else:
                        _OWN[final] = before  # (its descriptor still closed at the exit)
            raise
    except BaseException:
        os.close(fd)
        raise


def sweep(parent: str, until: float | None = None) -> int:
    """Remove the copies' directories in ``parent`` whose process is gone (their lock can be
    taken); returns how many. Best-effort: never raises an ``Exception``, stops at ``until``."""
    if fcntl is None:
        return 0
    removed = 0
    try:
        pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        with os.scandir(pfd) as entries:
            names = [e.name for e in entries if _LOCKED.fullmatch(e.name)]
        with _OWN_MUTEX:
            own = {(dev, ino) for _fd, dev, ino in _OWN.values()}
        for name in names:
            if until is not None and now() > until:
                break
            removed += _sweep_one(pfd, name, own)
    except Exception:
        pass
    finally:
        os.close(pfd)
    return removed


def _sweep_one(pfd: int, name: str, own: set[tuple[int, int]]) -> int:
    """Remove ``name`` (in the directory ``pfd``) if it is a directory of this user, not one of
    this process's, whose lock can be taken; 1 if removed."""
    assert fcntl is not None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
    except OSError:  # gone meanwhile, a symlink, not a directory, not ours to read
        return 0
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or (st.st_dev, st.st_ino) in own:
            return 0
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # locked: its process is alive (or no lock here: left alone)
            return 0
        now_st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        if (now_st.st_dev, now_st.st_ino) != (st.st_dev, st.st_ino):
            return 0  # the name was moved to something else meanwhile
        shutil.rmtree(name, ignore_errors=True, dir_fd=pfd)
        return 1
    finally:
        os.close(fd)  # (the lock goes with it)


def remove_dir(path: str | None, pid: int | None = None) -> None:
    """Remove the copies' directory (and give up its lock); with ``pid``, only in that process (a
    forked child ending normally runs its parent's exit handlers, and must not take the parent's
    copies)."""
    if path is not None and (pid is None or os.getpid() == pid):
        with _OWN_MUTEX:
            held = _OWN.get(path)
        try:
            st = os.stat(path, follow_symlinks=False)
            ours = held is None or (st.st_dev, st.st_ino) == (held[1], held[2])
        except OSError:
            ours = False
        if ours:  # (not a directory made under its name by someone else after a cleaner removed this one)
            shutil.rmtree(path, ignore_errors=True)
        with _OWN_MUTEX:
            held = _OWN.pop(path, None)
        if held is not None:
            try:
                os.close(held[0])
            except OSError:
                pass


#: this process's directory for DuckDB's spill files: (its process, its path), made by the first engine that needs it
_SPILL: tuple[int, str] | None = None
_SPILL_MUTEX = threading.Lock()


def spill_dir() -> str:
    """A directory for one engine's spill files (DuckDB makes it at its first spill, and removes it when the engine's
    connection closes), inside this process's directory for them (:func:`make_dir` of kind "spill": mode 0700,
    locked while the process lives, removed at its exit, swept after a SIGKILL). One such directory per process, not
    per engine: making and removing a directory costs about 3.5 ms of waiting on the system's temporary file system,
    which every Session would otherwise pay."""
    global _SPILL, _SPILL_MUTEX
    if _SPILL is not None and _SPILL[0] != os.getpid():  # a forked child: the parent's is the parent's
        _SPILL, _SPILL_MUTEX = None, threading.Lock()
    with _SPILL_MUTEX:
        if _SPILL is None or not _kept(_SPILL[1]):
            made = make_dir(None, kind="spill")
            atexit.register(remove_dir, made, os.getpid())
            _SPILL = (os.getpid(), made)
        return os.path.join(_SPILL[1], secrets.token_hex(8))


def keep_spill(path: str, used: bool) -> bool:
    """Whether an engine's spill directory ``path`` (:func:`spill_dir`) can take DuckDB's files, checked before every
    charge: its process's directory is still the one this process locked under that name, or, removed meanwhile (a
    temporary-file cleaner that does not honour the lock, such as tmpwatch or tmpreaper), is made again under it
    (:func:`_kept`); with ``used`` (DuckDB made ``path`` at an earlier spill: it makes it once, never again) ``path``
    too, mode 0700, where a cleaner removed it. False where something else holds the process directory's name (a
    directory of another user, a symlink): DuckDB would spill into it, and the caller refuses the query."""
    with _SPILL_MUTEX:
        if not _kept(os.path.dirname(path)):
            return False
        if used:
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass
            except OSError:
                return False
    return True


def _kept(path: str) -> bool:
    """Whether this process's directory ``path`` (:func:`make_dir`) can still be used: the directory it locked under that
    name (not a symlink, nor another directory made under the name), or, removed meanwhile, made again under it as
    :func:`make_dir` makes one (mode 0700 under a first name, locked, then renamed: a rename onto a name taken
    meanwhile by another user's directory, a symlink or a file fails). A directory made without a lock (no ``flock``
    on this system or file system): whether it is a directory, as before."""
    with _OWN_MUTEX:
        held = _OWN.get(path)
    if held is None or fcntl is None:
        return os.path.isdir(path)
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    else:
        return (st.st_dev, st.st_ino) == (held[1], held[2])
    parent, name = os.path.split(path)
    try:
        first = tempfile.mkdtemp(prefix=name.rsplit("-", 1)[0] + "-", dir=parent)
    except OSError:
        return False
    try:
        _lock_and_rename(first, path)
    except OSError:
        shutil.rmtree(first, ignore_errors=True)
        return False
    try:
        os.close(held[0])  # the removed directory's lock
    except OSError:
        pass
    return True


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
