"""One writer per job directory: the process that trains into it holds ``<job dir>/job.lock``.

The lock is an ``flock`` on that file, held for as long as the job runs in this process and
released by the operating system when the process ends in any way (SIGKILL, out of memory),
so a crash never blocks the resume. A second process into the same directory fails at once,
naming the holder (host, pid, since when) that the file records. Only global rank 0 of a
multi-process job takes it (``kiln.core.launch``'s workers and torchrun's or SLURM's other
ranks do not). On NFS, Linux turns ``flock`` into a POSIX lock the server keeps (NFSv4, or
NFSv3 with ``lockd``); a mount without lock support (``nolock``) makes it local to each
host, and where the filesystem refuses locks the job warns and runs without one.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE = "job.lock"
_held: list[int] = []  # the descriptor of the lock this process holds, while it holds it


def _close_in_child() -> None:
    # a forked child (a DataLoader worker) shares the lock's open file: were it to keep it, a
    # SIGKILLed job's orphaned workers would hold the lock, and its resume would be refused
    for fd in _held:
        os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_close_in_child)


class JobDirBusyError(RuntimeError):
    """Another process holds the job directory's lock (it is training into it)."""


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text())
        return f"pid {info['pid']} on host {info['host']}, since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not yet written its name"


@contextmanager
def job_dir_lock(job_dir: str | Path) -> Iterator[None]:
    """Hold ``job_dir``'s lock while the block runs.

    Raises:
        JobDirBusyError: Another process holds it; the message names that process.
    """
    path = Path(job_dir) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise JobDirBusyError(
                f"job directory {job_dir} is in use: {_holder(path)} is training into it "
                f"(it holds {path}). A job directory has one writer: wait for that process "
                "to end, or train into another directory (hydra.run.dir / hydra.sweep.dir)"
            ) from None
        except OSError as error:
            if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            warnings.warn(
                f"{path}: this filesystem refuses locks ({error.strerror}); the job runs "
                "without one, so nothing stops a second process from writing here",
                stacklevel=3,
            )
        since = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        info = {"host": socket.gethostname(), "pid": os.getpid(), "since": since}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        _held.append(fd)
        yield
    finally:
        if fd in _held:
            _held.remove(fd)
        os.close(fd)  # releases the lock
