"""A checkpoint directory belongs to one run.

``<dir>/run.json`` names the run (``run_id``) and lists the checkpoints it wrote, oldest first,
each with the checksum of its bytes (``checksum``; recorded after the file is complete and
renamed into place). Only listed files are ever resumed from or pruned; a file whose bytes no
longer match its checksum is damaged. ``run.json`` itself is replaced atomically. A run that
started from another run's checkpoint gets its own id and records that checkpoint as
``started_from``. A damaged checkpoint a resume skipped is delisted and renamed
``<name>.damaged`` (:func:`quarantine`).

A lost ``run.json`` is rebuilt from the files that prove themselves (``checkpoint.recover``):
every checkpoint carries its run's id, and its zip records carry their own CRC-32 (a sharded
checkpoint's files: the checksums in its ``checksums.json``).
"""

from __future__ import annotations

import json
import re
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.core.atomic import atomic_write
from kiln.core.checkpoints.checksum import checksum_damage, checksum_of
from kiln.core.checkpoints.registry import by_entry

RUN_FILE = "run.json"
RUN_FILE_TEMP_PREFIX = ".run.json."
CHECKPOINT_NAME = re.compile(r"^step-(\d+)\.ckpt$")


class CheckpointDirError(RuntimeError):
    """The checkpoint directory cannot hold this run: another run's, or not writable."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk): the message names it and the space
    it needed; its partial file is removed and the earlier checkpoints stay intact."""


class DamagedCheckpointError(RuntimeError):
    """A checkpoint's bytes do not match its checksum, or it cannot be read back."""


@dataclass
class RunFile:
    """What ``run.json`` holds."""

    run_id: str
    checkpoints: dict[str, str] = field(default_factory=dict)  # name -> checksum, oldest first
    # files saved under their own name (e.g. best.ckpt): checked, never pruned or resumed from
    named: dict[str, str] = field(default_factory=dict)
    # another run's checkpoint this run was resumed from: path, run_id, global_step
    started_from: dict[str, Any] | None = None


def new_run_id() -> str:
    """A fresh run id (16 hex digits)."""
    return uuid.uuid4().hex[:16]


def read_run_file(directory: str | Path) -> RunFile | None:
    """The ``run.json`` of ``directory``, or ``None`` if it has none."""
    path = Path(directory) / RUN_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        return RunFile(
            str(data["run_id"]),
            dict(data.get("checkpoints", {})),
            dict(data.get("named", {})),
            data.get("started_from"),
        )
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointDirError(
            f"{path} is not a kiln run file ({error}); it should hold "
            '{"run_id": ..., "checkpoints": {...}}: restore it or use a new checkpoint_dir'
        ) from None


def write_run_file(directory: str | Path, run: RunFile) -> None:
    """Replace ``directory``'s ``run.json`` atomically (:func:`kiln.core.atomic.atomic_write`)."""
    data: dict[str, Any] = {"run_id": run.run_id, "checkpoints": run.checkpoints}
    data["named"] = run.named
    if run.started_from is not None:
        data["started_from"] = run.started_from
    atomic_write(Path(directory) / RUN_FILE, json.dumps(data, indent=1))


DAMAGED_SUFFIX = ".damaged"


def quarantine(directory: str | Path, names: list[str]) -> list[Path]:
    """Take damaged checkpoints ``names`` (a resume skipped them) out of the run: delisted
    from ``run.json`` first, so they never count toward ``keep_last_k`` nor push out the
    intact checkpoint the run resumed from, then renamed ``<name>.damaged`` (kept for a
    look; no longer named like a checkpoint, so the step can be saved again). Only the
    directory's one writer may call it.

    Returns:
        The quarantined files' new paths.
    """
    import shutil

    directory = Path(directory)
    recorded = read_run_file(directory)
    if recorded is not None and any(name in recorded.checkpoints for name in names):
        recorded.checkpoints = {k: v for k, v in recorded.checkpoints.items() if k not in names}
        write_run_file(directory, recorded)  # first forget, then move: never list a lost file
    moved: list[Path] = []
    for name in names:
        path = directory / name
        if path.exists():
            target = path.with_name(name + DAMAGED_SUFFIX)
            if target.is_dir():  # an earlier quarantine of the same step's shards
                shutil.rmtree(target)
            path.replace(target)
            moved.append(target)
    return moved


def check_writable(directory: str | Path) -> None:
    """Create ``directory`` and write a file in it, or fail naming it (before training)."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(prefix=".write-test-", dir=directory):
            pass
    except OSError as error:
        raise CheckpointDirError(
            f"trainer.checkpoint_dir={str(directory)!r} is not writable "
            f"({error.strerror or error}): set it to a directory this job can create and write"
        ) from None


def holds_checkpoints(directory: Path) -> bool:
    """Whether ``directory`` holds any file named like a checkpoint."""
    if not directory.is_dir():
        return False
    return any(CHECKPOINT_NAME.match(p.name) for p in directory.iterdir())


def remove_leftovers(directory: str | Path) -> list[Path]:
    """Remove what a killed save left in ``directory`` (``.run.json.*`` and ``*.tmp`` files,
    ``.write-test-*`` probes); returns them. Only the directory's one writer may call it."""
    import shutil

    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [
        path
        for pattern in (f"{RUN_FILE_TEMP_PREFIX}*", "*.tmp", ".write-test-*")
        for path in directory.glob(pattern)
    ]
    for path in found:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return found


def _verified_run_id(path: Path) -> tuple[str | None, str | None]:
    """``(run id, None)`` of a checkpoint file whose zip records pass their CRC-32 check (a
    sharded checkpoint: whose files match its ``checksums.json``), or ``(None, why not)``."""
    import zipfile

    import torch

    if path.is_dir():
        problem = checksum_damage(path)
        if problem is not None:
            return None, problem
    try:
        if path.is_dir():
            meta = torch.load(path / "meta.pt", map_location="cpu", weights_only=True)
            run_id = by_entry(meta).get("loop", {}).get("run_id")
        else:
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
            if bad is not None:
                return None, f"its record {bad} fails its CRC-32 check"
            saved = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
            run_id = by_entry(dict(saved)).get("loop", {}).get("run_id")
    except Exception as error:  # truncated, not a zip, not unpicklable safely
        return None, f"it cannot be read ({type(error).__name__})"
    return (str(run_id), None) if run_id else (None, "it names no run (written by older kiln?)")


def rebuild_run_file(directory: str | Path) -> RunFile:
    """The ``run.json`` a directory that lost it had, rebuilt from its checkpoints that prove
    themselves (zip CRC-32 intact, the run's id inside), oldest first, with their checksums.

    Raises:
        CheckpointDirError: No checkpoint proves itself, or they name different runs.
    """
    directory = Path(directory)
    found = sorted(
        (int(m.group(1)), p) for p in directory.iterdir() if (m := CHECKPOINT_NAME.match(p.name))
    )
    verified: dict[str, str] = {}
    refused: list[str] = []
    runs: set[str] = set()
    for _, path in found:
        run_id, problem = _verified_run_id(path)
        if run_id is None:
            refused.append(f"{path.name}: {problem}")
            continue
        runs.add(run_id)
        verified[path.name] = checksum_of(path)
    why = f"; not usable: {', '.join(refused)}" if refused else ""
    if len(runs) != 1:
        named = f"they name runs {', '.join(sorted(runs))}" if runs else "none proves itself"
        raise CheckpointDirError(
            f"{directory / RUN_FILE} is missing and its checkpoints cannot rebuild it: "
            f"{named}{why}. Restore run.json, or resume one checkpoint explicitly "
            "(trainer.resume=<path>) into a new trainer.checkpoint_dir"
        )
    return RunFile(runs.pop(), verified)


def recorded_run(directory: str | Path) -> RunFile | None:
    """``directory``'s ``run.json``; where it is lost but checkpoints remain, the one they
    rebuild (:func:`rebuild_run_file`, in memory: :func:`claim` writes it); ``None`` where
    the directory holds neither."""
    recorded = read_run_file(directory)
    if recorded is None and holds_checkpoints(Path(directory)):
        return rebuild_run_file(directory)
    return recorded


def plan_claim(
    directory: str | Path,
    resume: str | None,
    resumed_run_id: str | None,
    source: str | Path | None = None,
    step: int | None = None,
) -> tuple[str, RunFile | None]:
    """What :func:`claim` would do, writing nothing: the run's id and the ``run.json`` to
    write (``None``: the directory's stays as it is). Raises as :func:`claim` does."""
    directory = Path(directory)
    recorded = recorded_run(directory)
    rebuilt = recorded is not None and not (directory / RUN_FILE).is_file()
    started_from = None
    if resume is None:
        run_id = new_run_id()
    elif source is not None and Path(source).resolve().parent != directory.resolve():
        run_id = new_run_id()  # another directory's checkpoint: a run of its own
        started_from = {
            "path": str(Path(source).resolve()),
            "run_id": resumed_run_id,
            "global_step": step,
        }
    else:
        run_id = resumed_run_id or (recorded.run_id if recorded else new_run_id())
    if recorded is not None and recorded.run_id == run_id:
        return run_id, recorded if rebuilt else None  # this run's own directory
    others = recorded is not None and (recorded.checkpoints or holds_checkpoints(directory))
    if others or (resume is None and holds_checkpoints(directory)):
        owner = f"run {recorded.run_id}" if recorded else "another run (no run.json)"
        how = (
            "continue that run with trainer.resume='auto', or give this run a new "
            "trainer.checkpoint_dir"
            if resume is None
            else f"give the resumed run {run_id} a new trainer.checkpoint_dir"
        )
        raise CheckpointDirError(
            f"trainer.checkpoint_dir={str(directory)!r} holds the checkpoints of {owner}; a "
            f"checkpoint directory belongs to one run: {how}"
        )
    return run_id, RunFile(run_id, started_from=started_from)


def claim(
    directory: str | Path,
    resume: str | None,
    resumed_run_id: str | None,
    source: str | Path | None = None,
    step: int | None = None,
) -> str:
    """Make ``directory`` the run's checkpoint directory; return the run's id.

    A fresh run (``resume=None``) gets a new id and refuses a directory holding any
    checkpoint. A run resumed from a checkpoint of this directory keeps that checkpoint's id
    (or the directory's, for ``resume='auto'`` with nothing to load); one resumed from a
    checkpoint elsewhere (another job's) is a run of its own: a new id, with ``source``
    recorded as ``started_from``. A resumed run refuses a directory whose ``run.json``
    names another run that has checkpoints there. A lost ``run.json`` is rebuilt from the
    checkpoints that prove themselves; what killed saves left behind is removed, and
    checkpoints it lists that are gone are delisted.

    Args:
        directory: The run's checkpoint directory.
        resume: ``trainer.resume``: ``None``, ``'auto'`` or a path.
        resumed_run_id: The run id stored in the loaded checkpoint.
        source: The loaded checkpoint.
        step: The loaded checkpoint's step.

    Raises:
        CheckpointDirError: The directory holds another run's checkpoints; the message names
            it and the choices.
    """
    import warnings

    directory = Path(directory)
    run_id, to_write = plan_claim(directory, resume, resumed_run_id, source, step)
    if to_write is not None and to_write.checkpoints:
        warnings.warn(
            f"{directory / RUN_FILE} was missing: rebuilt from the checkpoints that prove "
            f"themselves ({', '.join(to_write.checkpoints)})",
            stacklevel=2,
        )
    remove_leftovers(directory)
    if to_write is not None:
        write_run_file(directory, to_write)
    _delist_missing(directory)
    return run_id


def _delist_missing(directory: Path) -> None:
    """Delist the checkpoints ``run.json`` records that are gone (deleted by hand): they must
    not count toward ``keep_last_k`` nor be resumed from."""
    import warnings

    recorded = read_run_file(directory)
    if recorded is None:
        return
    gone = [name for name in recorded.checkpoints if not (directory / name).exists()]
    if not gone:
        return
    recorded.checkpoints = {k: v for k, v in recorded.checkpoints.items() if k not in gone}
    write_run_file(directory, recorded)
    warnings.warn(
        f"{directory / RUN_FILE} listed checkpoints that are missing, now delisted: "
        f"{', '.join(gone)}",
        stacklevel=3,
    )
