"""Finding and reading the jobs of a sweep: every ``bench.json`` and ``summary.json`` below it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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
    paths = sorted(root.rglob("bench.json")) + sorted(root.rglob("summary.json"))
    for path in paths:
        if "wandb" in path.relative_to(root).parts:
            continue  # W&B's own files are not job records
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            records.unreadable.append(f"{path}: {exc}")
            continue
        if not isinstance(record, dict):
            records.unreadable.append(f"{path}: not a JSON object")
            continue
        record.setdefault("job_dir", str(path.parent))
        kind = record.get("kind") or ("bench" if path.name == "bench.json" else "train")
        (records.bench if kind == "bench" else records.train).append(record)
    # A Hydra job directory without a record (the job died before writing one) is a row too.
    recorded = {path.parent for path in paths}
    for config in sorted(root.rglob(".hydra/config.yaml")):
        job_dir = config.parent.parent
        if job_dir not in recorded and "wandb" not in job_dir.relative_to(root).parts:
            records.train.append(
                {
                    "kind": "train",
                    "status": "failed",
                    "error": "no summary.json or bench.json: the job died before writing one",
                    "job_dir": str(job_dir),
                }
            )
    if not records.bench and not records.train:
        raise FileNotFoundError(
            f"no job records under {root}: expected <job dir>/bench.json (kiln-bench) or "
            "<job dir>/summary.json (kiln-train), e.g. multirun/<date>/<time>/0/bench.json"
        )
    return records
