"""A job directory's one writer: what a run may write there, and from when.

A run *owns* its job directory from the moment it starts its work (``kiln-train``'s train
stage, ``kiln-bench``'s measurement: :meth:`Lifecycle.track
<kiln.experiments.jobs.lifecycle.Lifecycle.track>` calls :func:`take`), or from its start
when the directory holds no earlier job's record. Until then, every file it would write there
(its attempt in ``attempts.json``, Hydra's ``.hydra/*.yaml``, its record, its log lines)
waits in memory: written when the run takes the directory, dropped when it is refused, finds
nothing to do, or is interrupted first. So a refused, skipped or interrupted run changes no
byte of an earlier job's record, and Hydra's files always describe the run that trained it.

Every file of a job's record is written through :func:`write` (``write_job_json`` calls it):
one place that decides, and one place a crash test observes (``kiln.core.atomic``'s commits).
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HYDRA_DIR = ".hydra"
"""Hydra's files of the run that trained the job: ``config.yaml``, ``hydra.yaml``,
``overrides.yaml`` (``hydra.output_subdir`` is ``null``: kiln writes them, not Hydra)."""

_WAITING = "waiting"
_OWNED = "owned"
_DROPPED = "dropped"

_lock = threading.Lock()
_state: dict[Path, str] = {}
_pending: dict[Path, dict[Path, bytes]] = {}
_on_take: dict[Path, Callable[[], None]] = {}  # the job log's: write the lines that waited


def _key(job_dir: str | os.PathLike[str]) -> Path:
    return Path(job_dir).resolve()


def _job_dir_of(path: Path) -> Path | None:
    for job_dir in _state:
        if path == job_dir or path.is_relative_to(job_dir):
            return job_dir
    return None


def state(path: str | os.PathLike[str]) -> str | None:
    """``waiting``, ``owned`` or ``dropped`` for a file or directory below a job directory
    this process runs (``None``: none)."""
    with _lock:
        job_dir = _job_dir_of(_key(path))
        return None if job_dir is None else _state[job_dir]


def write(path: str | os.PathLike[str], data: bytes | str) -> Path:
    """Write a file of a job's record: atomically now, or once the run owns the directory
    (:func:`take`) when it does not yet; a run that never does drops it."""
    from kiln.core.atomic import atomic_write

    path = Path(path)
    data = data.encode() if isinstance(data, str) else data
    with _lock:
        job_dir = _job_dir_of(_key(path))
        if job_dir is not None and _state[job_dir] != _OWNED:
            _pending[job_dir][_key(path)] = data
            return path
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, data)


@contextmanager
def held(job_dir: str | os.PathLike[str], *, owned: bool) -> Iterator[None]:
    """While a run works on ``job_dir``: it owns it from the start (``owned``: the directory
    holds no earlier job's record) or once it calls :func:`take`; at the end, what a run that
    never took it would have written is dropped."""
    key = _key(job_dir)
    with _lock:
        _state[key] = _OWNED if owned else _WAITING
        _pending[key] = {}
        listener = _on_take.get(key) if owned else None
    if listener is not None:
        listener()
    try:
        yield
    finally:
        with _lock:
            if _state.get(key) == _WAITING:
                _state[key] = _DROPPED
            _pending.pop(key, None)


def take(job_dir: str | os.PathLike[str]) -> None:
    """The run owns ``job_dir`` from now on: write what waited, in the order it came."""
    key = _key(job_dir)
    with _lock:
        if _state.get(key) != _WAITING:
            return
        waiting = _pending.pop(key, {})
        _state[key] = _OWNED
        listener = _on_take.get(key)
    for path, data in waiting.items():
        write(path, data)
    if listener is not None:
        listener()


class JobLog(logging.FileHandler):
    """Hydra's job log file (``<job dir>/<job name>.log``), written only by the run that owns
    the job directory: lines logged before it takes it wait, and a run that never does (a
    refused or skipped one) adds none to the earlier job's log."""

    def __init__(self, filename: str, mode: str = "a", encoding: str | None = None) -> None:
        super().__init__(filename, mode=mode, encoding=encoding, delay=True)
        self.waiting: list[str] = []
        job_dir = _key(Path(filename).parent)
        with _lock:  # a new Hydra job starts: what an earlier run in this process did is over
            _state.pop(job_dir, None)
            _on_take[job_dir] = self._write_waiting

    def emit(self, record: logging.LogRecord) -> None:
        where = state(self.baseFilename)
        if where == _DROPPED:
            return
        if where == _WAITING or (where is None and _unowned(self)):
            self.waiting.append(self.format(record))
            return
        self._write_waiting()
        super().emit(record)

    def _write_waiting(self) -> None:
        lines, self.waiting = self.waiting, []
        if not lines:
            return
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        with open(self.baseFilename, "a", encoding=self.encoding) as handle:
            handle.write("".join(line + self.terminator for line in lines))


def _unowned(handler: JobLog) -> bool:
    """Before its job starts (no :func:`held` yet): a directory that already holds a log is
    an earlier job's until the run takes it."""
    return Path(handler.baseFilename).exists()


def _jsonable(value: Any) -> Any:
    """Plain JSON values: tensors and numpy scalars become numbers, NaN/inf become null."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None  # strict JSON has no NaN; the status/error fields say what went wrong
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


def write_job_json(path: str | os.PathLike, payload: dict[str, Any] | list[Any]) -> Path:
    """Write ``payload`` as strict JSON to ``path`` atomically and durably
    (:func:`kiln.core.atomic.atomic_write`: a reader never sees half a file), through
    :func:`write` (a run writes a job's record only once it
    owns the directory).

    Args:
        path: Destination file, usually ``<job output dir>/summary.json`` or ``bench.json``.
        payload: The job's record; tensors, numpy scalars and non-finite floats are converted.

    Returns:
        The path written.
    """
    text = json.dumps(_jsonable(payload), indent=2, allow_nan=False) + "\n"
    return write(path, text)


REFUSED_NOTES = ".refused"
"""``<sweep dir>/.refused/<job>.json``: a sweep's jobs refused in an earlier job's directory
(which they may not write), for the end-of-sweep check to name; cleared as a sweep starts."""


def note_refusal(sweep_dir: str | None, job_name: str, error: str | None) -> None:
    """Tell the end-of-sweep check that the sweep's job ``job_name`` was refused (a single run
    says so on the console and exits non-zero itself)."""
    from kiln.core.atomic import atomic_write

    if sweep_dir is None:
        return
    notes = Path(sweep_dir) / REFUSED_NOTES
    notes.mkdir(parents=True, exist_ok=True)
    atomic_write(notes / f"{job_name}.json", json.dumps({"job": job_name, "error": error}))


def read_refusals(sweep_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The refusals :func:`note_refusal` left in ``sweep_dir``, in job order."""
    notes = sorted((Path(sweep_dir) / REFUSED_NOTES).glob("*.json"))
    found = []
    for note in notes:
        try:
            found.append(json.loads(note.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(found, key=lambda n: (len(str(n.get("job"))), str(n.get("job"))))


def clear_refusals(sweep_dir: str | os.PathLike[str]) -> None:
    """Forget an earlier sweep's refusals (a sweep starts)."""
    import shutil

    shutil.rmtree(Path(sweep_dir) / REFUSED_NOTES, ignore_errors=True)


WHERE_IT_RAN = ("output_dir", "sweep_dir", "config")
"""Record keys that say where and how the job ran, as it ran (kept absolute): the resolved
config (a re-run compares it) and the directories Hydra gave it."""


def relocatable(record: dict[str, Any], job_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """``record`` with every path it holds inside ``job_dir`` (a checkpoint, the W&B run's
    directory, a trace) made relative to it, so a moved or copied job reads its own files;
    :data:`WHERE_IT_RAN` stays as it is."""
    root = _key(job_dir)

    def relative(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: relative(v) for k, v in value.items()}
        if isinstance(value, list):
            return [relative(v) for v in value]
        if isinstance(value, str) and value.startswith(os.sep):
            path = Path(value)
            if path == root or path.is_relative_to(root):
                return str(path.relative_to(root))
        return value

    return {k: v if k in WHERE_IT_RAN else relative(v) for k, v in record.items()}
