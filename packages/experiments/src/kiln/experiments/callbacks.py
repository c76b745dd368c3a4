"""Hydra callbacks: the end-of-sweep check that makes a sweep with a failed job exit non-zero.

Jobs catch their own exceptions (so one NaN or OOM does not stop the sweep) and record
``status`` in their result file. When the sweep ends, :class:`SweepStatus` reads every job's
file in the sweep directory, prints one row per job, and exits with status 1 if any job
failed or left no file. It reads files rather than launcher return values, so it works the
same with the basic launcher and with submitit (local or SLURM), whose jobs run elsewhere.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from kiln.experiments.console import print_table, sweep_table

RESULT_FILES = ("summary.json", "bench.json")
FAILED = ("failed", "error")


def collect_jobs(sweep_dir: str | Path) -> list[tuple[str, dict[str, Any] | None]]:
    """Every job directory of a sweep (those holding ``.hydra/``) and its result, or ``None``."""
    jobs = []
    job_dirs = sorted(
        {p.parent.parent for p in Path(sweep_dir).rglob(".hydra/config.yaml")},
        key=lambda d: (len(d.parts), int(d.name) if d.name.isdigit() else -1, d.name),
    )  # 0, 1, ..., 10 in job order
    for job_dir in job_dirs:
        record = None
        for name in RESULT_FILES:
            if (job_dir / name).is_file():
                record = json.loads((job_dir / name).read_text())
                break
        jobs.append((str(job_dir.relative_to(sweep_dir)), record))
    return jobs


class SweepStatus(Callback):
    """Print the sweep's jobs at its end; exit non-zero if any failed."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        jobs = collect_jobs(sweep_dir)
        print_table(sweep_table(str(sweep_dir), jobs))
        failed = [d for d, r in jobs if r is None or r.get("status") in FAILED]
        if failed:
            print(f"{len(failed)} of {len(jobs)} jobs failed: {', '.join(failed)}", file=sys.stderr)
            sys.exit(1)
