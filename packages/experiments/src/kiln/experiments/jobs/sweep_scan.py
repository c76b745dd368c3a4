"""The one sweep scanner: every job directory below a sweep and the record it left.

A job directory is one that holds a job record (``summary.json``, ``bench.json``) or a
Hydra job's ``.hydra/config.yaml`` (a job that died before writing its record). The
end-of-sweep check (:mod:`kiln.experiments.jobs.hydra_callbacks`) and ``kiln-report``
both read a sweep through :func:`scan_sweep`, so both see the same jobs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.experiments.settings.job_info import RECORD_KINDS


@dataclass
class SweepJob:
    """One job directory of a sweep."""

    dir: Path
    name: str
    """The directory relative to the sweep (``"0"``, ``"1"``, ...; ``"."`` for a single job)."""
    record: dict[str, Any] | None
    """The job's record, or ``None`` when it left none or it does not parse."""
    file: Path | None = None
    """The record's file, if there is one."""
    unreadable: str | None = None
    """``"<file>: <why>"`` when the file is there but is not a JSON object."""


def _job_order(job_dir: Path) -> tuple:
    return (len(job_dir.parts), int(job_dir.name) if job_dir.name.isdigit() else -1, job_dir.name)


def _read(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return None, f"{path}: {exc}"
    if not isinstance(record, dict):
        return None, f"{path}: not a JSON object"
    return record, None


def scan_sweep(root: str | Path) -> list[SweepJob]:
    """Every job directory below ``root`` (a Hydra multirun dir, or one job's dir), in job
    order (0, 1, ..., 10), with its record; W&B's own directories are skipped."""
    root = Path(root)
    found = [p.parent for kind in RECORD_KINDS for p in root.rglob(kind.file)]
    found += [p.parent.parent for p in root.rglob(".hydra/config.yaml")]
    job_dirs = {d for d in found if "wandb" not in d.relative_to(root).parts}
    jobs = []
    for job_dir in sorted(job_dirs, key=_job_order):
        job = SweepJob(dir=job_dir, name=str(job_dir.relative_to(root)), record=None)
        for kind in RECORD_KINDS:
            if (job_dir / kind.file).is_file():
                job.file = job_dir / kind.file
                job.record, job.unreadable = _read(job.file)
                break
        jobs.append(job)
    return jobs
