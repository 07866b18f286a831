"""The command line's output targets for a charged release (``-o FILE``, ``--meta FILE``, standard
output), so that a release whose budget is spent is never lost to a failed write.

* Before the charge, each file target is opened as far as that has no effect the caller would not
  expect (:meth:`Target.prepare`): for a regular file (or a name not taken yet) its temporary sibling
  ``.NAME.dpsql-PID-RANDOM`` is created in the target's directory, which proves that the directory
  exists, is a directory and accepts new files (it stays flock'ed by the command until written or
  removed, so the next command writing that name removes the temporary file of a command that was
  killed meanwhile, and never a live one's: :func:`_sweep_dead`); a named pipe is opened when a reader is there (and
  refused when none is, where the write would block forever after the charge); a device
  (``/dev/stdout``, ``/dev/null``) is opened. A path that names one of the caller's own file descriptors
  (``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N``) is that stream, even when the job redirected it to a
  regular file (``>> rows.csv``, ``2>> job.log``): it is written in place through that descriptor, as
  standard output is without ``-o`` (a temporary sibling renamed over the file replaced the job's log).
  A target that fails is refused, naming its flag, with nothing charged.
* After the charge the output is rendered in memory, written to the temporary sibling, fsynced and
  renamed over the target: a failed write never leaves half a file at the target.
* A write that still fails after the charge (a full disk, the directory removed or made read-only
  meanwhile, ``/dev/full``) saves the released answer, which is a function of released values only,
  somewhere durable (:func:`rescue`): beside a ledger file (whose directory took the charge's write a
  moment ago), else in the user's state directory, else the temporary directory; the error says
  where and how to copy it to where it was meant to go.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import secrets
import shlex
import stat
import time
from dataclasses import dataclass, field

from dpsql._pipes import reader_gone
from dpsql.errors import ConfigError
from dpsql.ledger._store import names_file, sweep_unlocked


@dataclass
class Target:
    """One output file: ``fd`` is open for writing from before the charge; ``tmp`` is the temporary
    sibling renamed over ``real`` once written (None for a pipe or a device, written in place)."""

    flag: str
    path: str
    real: str = ""
    fd: int | None = None
    tmp: str | None = None
    done: bool = field(default=False)

    @classmethod
    def prepare(cls, flag: str, path: str) -> Target:
        t = cls(flag, path, real=os.path.realpath(path))
        where = f"{flag} {path!r}"
        try:
            st: os.stat_result | None = os.stat(path)  # follows links: /dev/stdout -> a pipe or a file
        except FileNotFoundError:
            st = None
        except OSError as e:
            raise ConfigError(f"{where} cannot be written ({e.strerror}); nothing was charged",
                              hint=f"give {flag} a file in a directory you can write to") from None
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise ConfigError(f"{where} is a directory; nothing was charged", hint=f"give a file name, e.g. {flag} {_example(flag)}")
        if st is not None and not stat.S_ISREG(st.st_mode):
            t.fd = _open_special(where, flag, path, st)
            return t
        caller = caller_fd(path)
        if st is None and caller is not None:  # /dev/fd/9 of a descriptor the caller did not open
            raise ConfigError(f"{where} is file descriptor {caller}, which is not open; nothing was charged",
                              hint=f"open it for the command ({caller}>> FILE), or give {flag} a file")
        if st is not None and caller is not None:  # the caller's stream, redirected to a file (`>> rows.csv`)
            try:
                writable = fcntl.fcntl(caller, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDONLY
                t.fd = os.dup(caller) if writable else None
            except OSError:
                t.fd = None
            if t.fd is None:
                raise ConfigError(f"{where} is file descriptor {caller}, which is not open for writing; nothing was charged",
                                  hint=f"redirect it to a file ({caller}>> FILE), or give {flag} a file")
            os.set_inheritable(t.fd, False)
            return t
        d, name = os.path.split(t.real)
        prefix = _temp_prefix(d, name)
        for _ in range(3):
            tmp = os.path.join(d, f"{prefix}{os.getpid()}-{secrets.token_hex(4)}")
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            except OSError as e:
                why = e.strerror or type(e).__name__
                if isinstance(e, (FileNotFoundError, NotADirectoryError)):
                    why = f"directory {d} does not exist" if not os.path.lexists(d) else f"{d} is not a directory"
                raise ConfigError(f"{where} cannot be written: creating a file in {d} failed ({why}); nothing was charged",
                                  hint=f"give {flag} a file in a directory that exists and that you can write to, e.g. "
                                  f"{flag} {_example(flag)}") from None
            t.fd, t.tmp = fd, tmp
            # locked for as long as this process may still write it; a sweep (of another command writing
            # the same name) may have taken it in the instant before: then it is gone, and made again
            if _lock_now(fd) and names_file(tmp, fd):
                _sweep_dead(d, prefix, tmp)
                return t
            t.discard()
        raise ConfigError(f"{where} cannot be written: its temporary file in {d} kept disappearing; nothing was charged",
                          hint=f"retry, or give {flag} a file in a directory no other program cleans")

    def write(self, data: bytes) -> None:
        """Write ``data`` whole, then (for a file) fsync and rename it over the target."""
        assert self.fd is not None
        _write_all(self.fd, data)
        if self.tmp is not None:
            os.fsync(self.fd)
            if os.path.exists(self.real):
                with contextlib.suppress(OSError):
                    os.chmod(self.tmp, stat.S_IMODE(os.stat(self.real).st_mode))
            os.replace(self.tmp, self.real)
            self.tmp = None
            _fsync_dir(os.path.dirname(self.real))
        self.done = True

    def discard(self) -> None:
        """Close the target; remove the temporary sibling unless it was renamed."""
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None
        if self.tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.tmp)
            self.tmp = None


def caller_fd(path: str) -> int | None:
    """The file descriptor of this process that ``path`` names (``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N``,
    ``/proc/self/fd/N``), or None for any other path."""
    p = os.path.abspath(path)
    if p in ("/dev/stdout", "/dev/stderr"):
        return 1 if p == "/dev/stdout" else 2
    parts = p.split("/")
    if len(parts) == 4 and parts[1:3] == ["dev", "fd"] and parts[3].isascii() and parts[3].isdigit():
        return int(parts[3])
    if (len(parts) == 5 and parts[1] == "proc" and parts[3] == "fd" and parts[4].isascii() and parts[4].isdigit()
            and parts[2] in ("self", "thread-self", str(os.getpid()))):
        return int(parts[4])
    return None


def _lock_now(fd: int) -> bool:
    """An exclusive flock of ``fd`` (a new file: granted at once unless a sweep holds it an instant)."""
    for _ in range(100):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            time.sleep(0.001)
        except OSError:  # a file system without flock: nothing sweeps there either
            return True
    return False


def _sweep_dead(d: str, prefix: str, mine: str) -> None:
    """Remove the temporary files ``prefix*`` in ``d`` that a command killed between opening its
    output and writing it (SIGKILL, the OOM killer: a query can run for minutes) left behind: those
    whose flock this process is granted without blocking. Their writer holds it from creation (having
    checked that the name is still its file) until the file is renamed or removed, and a flock dies with
    its holder, so a live writer's file is never removed. Only regular files are opened, never
    through a symbolic link, without blocking; one that cannot be opened is left alone."""
    sweep_unlocked(d, prefix, mine)


def _temp_prefix(d: str, name: str) -> str:
    """``.NAME.dpsql-``, the prefix of a temporary sibling's name (the process id and 8 random hex digits follow);
    where that would pass the file system's longest name, NAME cut short, followed by ``~`` and 8 hex digits of its
    digest (an output named within the limit was refused: 'File name too long')."""
    prefix, tail = f".{name}.dpsql-", 16  # the process id (at most 7 digits: pid_max 2^22), "-" and 8 hex digits
    try:
        most = os.pathconf(d, "PC_NAME_MAX")
    except (OSError, ValueError):
        most = 255
    if len(os.fsencode(prefix)) + tail <= most:
        return prefix
    raw = os.fsencode(name)
    digest = hashlib.sha256(raw).hexdigest()[:8]
    keep = max(1, most - tail - len(f"..dpsql-~{digest}"))
    return f".{os.fsdecode(raw[:keep])}~{digest}.dpsql-"


def _example(flag: str) -> str:
    return "result.csv" if flag == "-o" else "meta.json"


def _open_special(where: str, flag: str, path: str, st: os.stat_result) -> int:
    """A pipe or a device, opened now: a named pipe without a reader is refused (the write would
    block for ever after the charge); opening one with a reader sends it nothing until the write."""
    fifo = stat.S_ISFIFO(st.st_mode)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | (os.O_NONBLOCK if fifo else 0))
    except OSError as e:
        if fifo and e.errno == errno.ENXIO:  # no process has the pipe open for reading
            raise ConfigError(f"{where} is a named pipe that no process is reading; nothing was charged",
                              hint=f"start the reader first (e.g. cat {shlex.quote(path)} &), or give {flag} a file") from None
        raise ConfigError(f"{where} cannot be opened for writing ({e.strerror or type(e).__name__}); nothing was charged",
                          hint=f"give {flag} a file in a directory you can write to") from None
    if fifo and reader_gone(fd):  # (/dev/stdout of `dpsql ... | loader` whose loader has ended): EPIPE after the charge
        os.close(fd)
        raise ConfigError(f"{where} is a pipe whose reader has closed it (the program reading it has ended); nothing was "
                          "charged", hint=f"check the program that reads the pipe, or give {flag} a file")
    if fifo:
        os.set_blocking(fd, True)
    return fd


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _fsync_dir(d: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(d or ".", os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _rescue_dirs(ledger_path: str | None) -> list[str]:
    """Where a release that could not be written is saved, most durable first."""
    out = []
    if ledger_path and not ledger_path.startswith(("postgresql://", "postgres://")):
        real = os.path.realpath(ledger_path)
        d, name = os.path.split(real)
        out.append(os.path.join(d, f".{name}.releases"))
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    if os.path.isabs(state):
        out.append(os.path.join(state, "dpsql", "releases"))
    import tempfile

    out.append(os.path.join(tempfile.gettempdir(), f"dpsql-releases-{os.getuid()}"))
    return out


def rescue(files: dict[str, bytes], entry: int | None, ledger_path: str | None) -> str | None:
    """Save ``files`` (name -> content) in a new directory of their own (mode 0700, files 0600,
    each fsynced); its path, or None when no candidate place could take them."""
    for base in _rescue_dirs(ledger_path):
        d = os.path.join(base, f"entry-{entry if entry is not None else 'none'}-{secrets.token_hex(3)}")
        try:
            os.makedirs(base, mode=0o700, exist_ok=True)
            os.mkdir(d, 0o700)
        except OSError:
            continue
        try:
            for name, data in files.items():
                fd = os.open(os.path.join(d, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                try:
                    _write_all(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            _fsync_dir(d)
            _fsync_dir(base)
        except OSError:
            import shutil

            shutil.rmtree(d, ignore_errors=True)
            continue
        return d
    return None


def saved_text(d: str | None, files: dict[str, str]) -> tuple[str, str]:
    """The sentence and the hint that say where the release was saved: ``files`` maps each saved
    name to where it was meant to go ('' for standard output)."""
    if d is None:
        return ("; saving the released answer elsewhere failed too (no writable place was found), so it is lost",
                "free disk space or choose another output; the release cannot be written again without a new charge")
    cmds = [f"cat {shlex.quote(os.path.join(d, n))}" if not to else f"cp {shlex.quote(os.path.join(d, n))} {shlex.quote(to)}"
            for n, to in files.items()]
    return (f"; the released answer was saved to {d}{os.sep}",
            "get it back with: " + " && ".join(cmds) + " (release.json there holds its rows and meta as JSON); "
            "running the query again would charge again")


def first_line(e: BaseException) -> str:
    """What failed, without the error's text (a writer's message could quote a value)."""
    return (e.strerror if isinstance(e, OSError) else None) or type(e).__name__
