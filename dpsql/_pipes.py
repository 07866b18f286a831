"""Whether a pipe dpsql writes to still has a reader: used before a charge by the CLI (standard output) and by
the output writer (``-o`` a FIFO), in a module of its own so that the check loads nothing else."""

from __future__ import annotations


def reader_gone(fd: int) -> bool:
    """Whether the pipe ``fd`` writes to has no reader left: poll() reports POLLERR on its write end (no write)."""
    import select

    if not hasattr(select, "poll"):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    try:
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except OSError:
        return False
