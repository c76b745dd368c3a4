"""Writing files so that a reader, or a machine that loses power, never sees half of one.

Every file kiln writes whole (checkpoints, ``run.json``, ``summary.json``, a worker's result)
goes the same way: into a temporary file beside it, flushed and fsynced, renamed over the
destination, and the directory fsynced so the rename itself survives a crash.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

TEMP_SUFFIX = ".tmp"
"""How a temporary file ends (a killed writer's is removed by ``rundir.remove_leftovers``)."""

commit_observers: list[Callable[[Path], None]] = []
"""Called with each path :func:`replace_synced` commits (a job's record file, a checkpoint
directory, ``run.json``), once it is in place and durable: the points where a job's record
changes, at which kiln's crash tests kill a job (``tests/experiments/crash_points.py``).
Empty unless a test adds one."""


def fsync_path(path: Path) -> None:
    """Flush ``path`` (a file, or every file below a directory) to disk."""
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    for file in files:
        with open(file, "rb") as handle:
            os.fsync(handle.fileno())


def fsync_directory(directory: Path) -> None:
    """Make a rename into ``directory`` durable (skipped where a directory cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: Path, data: bytes | memoryview) -> None:
    """Write ``data`` to ``path`` and fsync it (no rename: the caller renames it into place)."""
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def replace_synced(temp: Path, final: Path) -> None:
    """Rename the complete, fsynced ``temp`` over ``final`` and fsync their directory."""
    os.replace(temp, final)
    fsync_directory(final.parent)
    for observer in commit_observers:
        observer(final)


def atomic_write(path: str | os.PathLike[str], data: bytes | str) -> Path:
    """Replace ``path`` with ``data`` atomically and durably; the temporary file is removed
    if anything fails (a full disk keeps no half-written copy).

    Args:
        path: The destination; its directory must exist.
        data: The file's bytes (a ``str`` is written as UTF-8).

    Returns:
        The path written.
    """
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    os.close(fd)
    temp = Path(name)
    try:
        write_synced(temp, data.encode() if isinstance(data, str) else data)
        replace_synced(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return path
