"""Reading the jobs of a sweep for a report: every job's record, split by kind."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.experiments.jobs.sweep_scan import scan_sweep
from kiln.experiments.settings.job_info import BENCH, TRAIN


@dataclass
class SweepRecords:
    """The job records of one sweep directory, split by kind."""

    root: Path
    bench: list[dict[str, Any]] = field(default_factory=list)
    """``bench.json`` records (kiln-bench jobs)."""
    train: list[dict[str, Any]] = field(default_factory=list)
    """``summary.json`` records (kiln-train jobs)."""
    unreadable: list[str] = field(default_factory=list)
    """Files that were found but could not be parsed, with the reason."""


def load_sweep(root: str | Path) -> SweepRecords:
    """Read every job record below ``root`` (a Hydra multirun dir, or one job's dir).

    Raises:
        FileNotFoundError: If ``root`` does not exist or holds no ``bench.json``/``summary.json``.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"sweep directory {root} does not exist")
    records = SweepRecords(root=root)
    for job in scan_sweep(root):
        if job.unreadable:
            records.unreadable.append(job.unreadable)
            continue
        if job.record is None:  # a Hydra job that died before writing its record is a row too
            records.train.append(
                {
                    "kind": TRAIN.name,
                    "status": TRAIN.failed_status,
                    "error": f"no {TRAIN.file} or {BENCH.file}: the job died before writing one",
                    "job_dir": str(job.dir),
                }
            )
            continue
        record = {**job.record}
        record.setdefault("job_dir", str(job.dir))
        assert job.file is not None
        kind = record.get("kind") or (BENCH.name if job.file.name == BENCH.file else TRAIN.name)
        (records.bench if kind == BENCH.name else records.train).append(record)
    if not records.bench and not records.train:
        unreadable = "".join(f"; unreadable: {u}" for u in records.unreadable)
        raise FileNotFoundError(
            f"no job records under {root}: expected <job dir>/bench.json (kiln-bench) or "
            "<job dir>/summary.json (kiln-train), e.g. multirun/<date>/<time>/0/bench.json"
            + unreadable
        )
    return records
