"""A job's directory is its record: what lies in one, where its recorded paths point, and
where ``kiln-eval`` and ``kiln-export`` may write instead.

A kiln job directory holds a job record (``summary.json``, ``bench.json``), ``attempts.json``,
Hydra's ``.hydra/``, ``job.lock`` or a ``checkpoints/run.json``. Only the run that trains a
job writes in it; the tools refuse any path in one (:func:`enclosing_job_dir`).

A record's paths into its own job directory are read relative to where the job is now
(:func:`in_job`): a job copied or moved to another directory (or machine) is evaluated,
exported and resumed from its own files, never from the original's. Records of earlier
releases hold absolute paths: one inside the directory the job recorded as its own
(``output_dir``) is mapped to the job's current directory.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

from kiln.experiments.settings.job_info import RECORD_KINDS

JOB_MARKERS = (
    *(kind.file for kind in RECORD_KINDS),
    "attempts.json",  # train.rerun.ATTEMPTS_FILE (jobs/ does not import train/)
    ".hydra",
    "job.lock",
    "checkpoints/run.json",
)
"""What makes a directory a kiln job's: any one of these in it."""


def is_job_dir(path: Path) -> bool:
    """Whether the directory ``path`` is a kiln job's (it holds one of :data:`JOB_MARKERS`)."""
    return path.is_dir() and any((path / marker).exists() for marker in JOB_MARKERS)


def enclosing_job_dir(path: str | Path) -> Path | None:
    """The kiln job directory ``path`` is or lies inside (it need not exist yet), or ``None``."""
    path = Path(path).absolute()
    for directory in [path, *path.parents]:
        if is_job_dir(directory):
            return directory
    return None


def recorded_job_dir(record: dict[str, Any]) -> Path | None:
    """The directory a job's record says it was written in (``output_dir``, else its config's
    ``paths.output_dir``): where its absolute paths point when it has not moved."""
    config = record.get("config") or {}
    recorded = record.get("output_dir") or (config.get("paths") or {}).get("output_dir")
    return Path(recorded) if recorded else None


def in_job(value: str | Path, job_dir: Path, record: dict[str, Any]) -> Path:
    """The path a job's record holds (``value``), where it is now that the job is in
    ``job_dir``: a relative path is the job directory's; an absolute one inside the directory
    the record was written in (:func:`recorded_job_dir`) is mapped to ``job_dir``; any other
    absolute path (outside the job) is returned as it is."""
    path = Path(value)
    if not path.is_absolute():
        return job_dir / path
    original = recorded_job_dir(record)
    if original is not None and original.is_absolute() and path.is_relative_to(original):
        return job_dir / path.relative_to(original)
    return path


def _names(directory: Path, limit: int = 3) -> str:
    names = sorted(p.name for p in directory.iterdir())
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def check_not_in_job(path: Path, what: str, valid: str) -> None:
    """Refuse ``path`` (``what`` names it, e.g. ``out_dir``) when it is or lies inside a kiln
    job directory.

    Raises:
        ValueError: One line naming the path, the job directory and ``valid``.
    """
    job = enclosing_job_dir(path)
    if job is not None:
        where = "is" if job == path.absolute() else "lies inside"
        raise ValueError(
            f"{what} {path} {where} the kiln job directory {job}, which only its training "
            f"run writes (it is the job's record): {valid}"
        )


EXPORT_VALID = (
    "give a new or empty directory, or one holding an earlier export of this same job, "
    "outside any job directory"
)


def check_export_dir(
    out: Path, export_file: str, run_id: Any, model: Any, results: tuple[str, ...] = ()
) -> None:
    """Refuse an export directory that would mix two models' files or write into a job's
    record: ``out`` must be new, empty, or hold an earlier export (``export_file``) of this
    same job (run ``run_id``, ``model``) and nothing else it did not list but what was made
    of it (``results``: file names or ``<dir>/`` prefixes, e.g. kiln-eval's ``eval.json``
    and ``wandb/``), which the replaced export takes with it.

    Raises:
        ValueError: One line naming ``out``, what it holds and what is valid.
    """
    check_not_in_job(out, "out_dir", EXPORT_VALID)
    if not out.exists():
        return
    if not out.is_dir():
        raise ValueError(f"out_dir {out} is a file, not a directory: {EXPORT_VALID}")
    if not any(out.iterdir()):
        return
    record_file = out / export_file
    if not record_file.is_file():
        raise ValueError(
            f"out_dir {out} is not empty and holds no kiln export ({_names(out)}): {EXPORT_VALID}"
        )
    try:
        record = json.loads(record_file.read_text())
    except (OSError, ValueError):
        record = {}
    if not isinstance(record, dict):
        record = {}
    theirs = record.get("model")
    name = theirs.get("name") if isinstance(theirs, dict) else None
    if record.get("run_id") != run_id or record.get("model") != model:
        raise ValueError(
            f"out_dir {out} holds the export of another model (model {name or '?'}, run "
            f"{record.get('run_id') or '?'}; this is run {run_id}): {EXPORT_VALID}"
        )
    listed = record.get("files")
    if isinstance(listed, list):
        written = {str(p.relative_to(out)) for p in out.rglob("*") if not p.is_dir()}
        unknown = sorted(
            name
            for name in written - set(listed) - {export_file}
            if not any(name == r or (r.endswith("/") and name.startswith(r)) for r in results)
        )
        if unknown:
            raise ValueError(
                f"out_dir {out} holds files its earlier export did not write "
                f"({', '.join(unknown[:3])}{' ...' if len(unknown) > 3 else ''}): move them "
                f"out first, or {EXPORT_VALID}"
            )


def staging_dir(out: Path) -> Path:
    """A new hidden directory beside ``out`` (the same file system) to write ``out`` in."""
    out.absolute().parent.mkdir(parents=True, exist_ok=True)
    staging = out.absolute().parent / f".{out.name}.writing-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    return staging


def replace_dir(staging: Path, out: Path) -> None:
    """Put the finished ``staging`` directory in place of ``out`` (absent, empty or an earlier
    export of the same job) by renames: ``out`` never holds a mix of the two."""
    out = out.absolute()
    if not out.exists():
        staging.rename(out)
        return
    old = out.parent / f".{out.name}.replaced-{uuid.uuid4().hex[:8]}"
    out.rename(old)
    staging.rename(out)
    shutil.rmtree(old, ignore_errors=True)
