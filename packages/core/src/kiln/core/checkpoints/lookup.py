"""Which checkpoints a run has, and whether one is intact.

A checkpoint is ``<dir>/step-<global_step:08d>.ckpt``: a torch distributed checkpoint
directory (see ``save``). A file of that name is a checkpoint of an earlier kiln release
(one ``torch.save`` archive), still resumed, exported and evaluated (see ``load``).
"""

from __future__ import annotations

import warnings
import zipfile
from pathlib import Path

from kiln.core.checkpoints import checksum
from kiln.core.checkpoints.rundir import read_run_file, recorded_run

META = "meta.pt"
"""A checkpoint directory's plain values and small objects' state, written by rank 0."""
DCP_METADATA = ".metadata"
"""What torch distributed checkpoint writes last, once every rank's shards are written."""


def checkpoint_path(directory: str | Path, step: int) -> Path:
    """Path of the checkpoint for optimizer step ``step``: ``directory/step-{step:08d}.ckpt``."""
    if step < 0:
        raise ValueError(f"step={step} is not valid; a checkpoint step must be >= 0")
    return Path(directory) / f"step-{step:08d}.ckpt"


def is_legacy(path: Path) -> bool:
    """Whether ``path`` is an earlier release's one-file checkpoint (a ``torch.save`` archive)."""
    return path.is_file()


def is_checkpoint_dir(path: Path) -> bool:
    """Whether the directory ``path`` is a checkpoint (not a run's or a job's directory)."""
    return (path / DCP_METADATA).exists() or (path / META).exists()


def _is_complete(path: Path) -> bool:
    """Whether ``path`` looks like a whole checkpoint (cheap: no tensor is read)."""
    if path.is_dir():
        return (path / DCP_METADATA).is_file() and (path / META).is_file()
    # torch.save writes a zip archive whose central directory comes last
    try:
        return zipfile.is_zipfile(path)
    except OSError:
        return False


def _listed(directory: Path) -> list[Path]:
    """Every checkpoint ``run.json`` records (rebuilt where lost), newest first."""
    recorded = recorded_run(directory) if directory.is_dir() else None
    return [] if recorded is None else [directory / name for name in reversed(recorded.checkpoints)]


def checkpoint_candidates(directory: str | Path) -> list[Path]:
    """The checkpoints a resume may use, newest first: those ``run.json`` records (in the
    order written) that are still there (:func:`missing_checkpoints` names the others);
    where ``run.json`` is lost, those that prove themselves (``rundir.rebuild_run_file``;
    it raises ``CheckpointDirError`` where none does)."""
    return [path for path in _listed(Path(directory)) if path.exists()]


def missing_checkpoints(directory: str | Path) -> list[Path]:
    """The checkpoints ``run.json`` records that are gone (deleted by hand), newest first: a
    resume skips them (``rundir.claim`` delists them)."""
    return [path for path in _listed(Path(directory)) if not path.exists()]


def damage(path: str | Path) -> str | None:
    """Why ``path`` cannot be a good checkpoint (missing, incomplete, checksum mismatch), or
    ``None``. Reads every byte once, or twice where ``run.json`` records its checksum."""
    path = Path(path)
    if not path.exists():
        return "the file is missing"
    if not _is_complete(path):
        return "the file is incomplete or unreadable (truncated?)"
    if path.is_dir():  # each file against the directory's own checksums.json
        problem = checksum.checksum_damage(path)
        if problem is not None:
            return problem
    recorded = read_run_file(path.parent)
    expected = None
    if recorded is not None:
        expected = recorded.checkpoints.get(path.name, recorded.named.get(path.name))
    if expected is not None and not checksum.matches(path, expected):
        return f"its checksum does not match the one {path.parent / 'run.json'} recorded"
    if expected is None and path.is_file():  # no run.json to compare with: its own CRC-32s
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
        if bad is not None:
            return f"its record {bad} fails its CRC-32 check"
    return None


def find_latest_checkpoint(directory: str | Path) -> Path | None:
    """The newest intact checkpoint in ``directory`` (see :func:`checkpoint_candidates`).

    Temporary files of interrupted saves are never considered; missing and damaged
    checkpoints (truncated, unreadable, or not matching their recorded checksum) are
    skipped with a warning that names them.
    """
    for path in missing_checkpoints(directory):
        warnings.warn(f"skipping checkpoint {path}: it is missing", stacklevel=2)
    for path in checkpoint_candidates(directory):
        problem = damage(path)
        if problem is None:
            return path
        warnings.warn(f"skipping damaged checkpoint {path}: {problem}", stacklevel=2)
    return None


def check_not_a_plain_directory(path: Path) -> None:
    """Refuse a directory that is no checkpoint (a checkpoint dir, a job dir) given as a
    checkpoint, naming what to pass instead.

    Raises:
        IsADirectoryError: ``path`` is such a directory.
    """
    if not path.is_dir() or is_checkpoint_dir(path):
        return
    found = [d for d in (path, path / "checkpoints") if d.is_dir() and checkpoint_candidates(d)]
    if not found:
        raise IsADirectoryError(
            f"checkpoint {path} is a directory and holds no checkpoint (step-<N>.ckpt): pass "
            "a checkpoint; to resume a run from its newest intact checkpoint, "
            "trainer.resume=auto with trainer.checkpoint_dir=<the directory holding them>"
        )
    directory = found[0]
    raise IsADirectoryError(
        f"checkpoint {path} is a directory, not a checkpoint: pass one of its checkpoints "
        f"(newest: {checkpoint_candidates(directory)[0]}); to resume a run from its "
        f"newest intact checkpoint, trainer.resume=auto with trainer.checkpoint_dir={directory}"
    )
