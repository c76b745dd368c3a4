"""Hydra callbacks: the end-of-sweep check that makes a sweep with a failed job exit non-zero.

Jobs catch their own exceptions (so one NaN or OOM does not stop the sweep) and record
``status`` in their result file. When the sweep ends, :class:`SweepStatus` reads every job's
file in the sweep directory, prints one row per job, and exits with status 1 if any job
failed or left no readable file. It reads files rather than launcher return values, so it
works the same with the basic launcher and with submitit (local or SLURM), whose jobs run
elsewhere.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from kiln.experiments.console import show_table, sweep_table
from kiln.experiments.job import FAILED_STATUSES
from kiln.experiments.sweep import scan_sweep


class SweepStatus(Callback):
    """Print the sweep's jobs at its end; exit non-zero if any failed."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        jobs = scan_sweep(sweep_dir)
        show_table(sweep_table(str(sweep_dir), jobs))
        failed = [
            j.name for j in jobs if j.record is None or j.record.get("status") in FAILED_STATUSES
        ]
        if failed:
            print(f"{len(failed)} of {len(jobs)} jobs failed: {', '.join(failed)}", file=sys.stderr)
            sys.exit(1)
