"""Hydra callbacks: the end-of-sweep check that makes a sweep with a failed job exit non-zero,
the start-of-sweep check that a study optimizes the way its metric says, and the start-of-run
check that the output directory is not a file.

Jobs catch their own exceptions (so one NaN or OOM does not stop the sweep) and record
``status`` in their result file. When the sweep ends, :class:`SweepStatus` reads every job's
file in the sweep directory, prints one row per job, and exits with status 1 if any job
failed, was stopped, or left no readable file. It reads files rather than launcher return
values, so it works the same with the basic launcher and with submitit (local or SLURM),
whose jobs run elsewhere.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from kiln.experiments.jobs.console import show_table, sweep_table
from kiln.experiments.jobs.sweep_scan import scan_sweep
from kiln.experiments.settings.job_info import FAILED_STATUSES, STOPPED


class StudyDirection(Callback):
    """Before a study's first trial: the sweeper's ``direction`` must be the one
    ``optimized_metric.mode`` asks for (``min`` -> ``minimize``, ``max`` -> ``maximize``).

    ``configs/hparams_search`` derive the direction from the mode; this catches a direction
    set by hand (``hydra.sweeper.direction=minimize optimized_metric.mode=max``), which would
    rank the trials backwards. The sweep exits (status 1) before any trial starts.
    """

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from omegaconf import OmegaConf

        from kiln.experiments.settings.resolvers import DIRECTIONS, study_direction

        direction = OmegaConf.select(config, "hydra.sweeper.direction", default=None)
        mode = OmegaConf.select(config, "optimized_metric.mode", default=None)
        if direction is None or mode is None or not isinstance(direction, str):
            return  # not a single-objective study (the basic sweeper has no direction)
        direction = direction.lower().removeprefix("direction.")  # an Optuna enum's name
        if direction != study_direction(mode):
            wanted = {v: k for k, v in DIRECTIONS.items()}.get(direction, "?")
            # SystemExit: Hydra turns a callback's Exception into a warning and goes on
            raise SystemExit(
                f"hydra.sweeper.direction={direction} but optimized_metric.mode={mode}: the "
                f"study would rank trials backwards. Set optimized_metric.mode={wanted}, or "
                f"leave hydra.sweeper.direction unset (configs/hparams_search derive it from "
                f"the mode: {study_direction(mode)})"
            )


class OutputDirCheck(Callback):
    """Before a run or sweep: its output directory (``hydra.run.dir``, ``hydra.sweep.dir``)
    must be a directory or not exist yet; a file there fails naming it (Hydra's own
    ``mkdir`` would end in a bare ``FileExistsError``)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check_output_dir("hydra.run.dir", config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check_output_dir("hydra.sweep.dir", config)


def _check_output_dir(key: str, config: DictConfig) -> None:
    from omegaconf import OmegaConf

    path = Path(str(OmegaConf.select(config, key)))
    blocked = next((p for p in (path, *path.parents) if p.exists()), None)
    if blocked is not None and not blocked.is_dir():
        # SystemExit: Hydra turns a callback's Exception into a warning and goes on
        raise SystemExit(
            f"{key}={path}: {blocked} is a file, not a directory; a job writes its record, "
            f"checkpoints and W&B run into {key}: give a directory (new or existing)"
        )


class SweepStatus(Callback):
    """Print the sweep's jobs at its end; exit non-zero if any failed.

    A sweep whose every job was refused (their directories are another sweep's, training)
    leaves the sweep directory's ``multirun.yaml`` as that sweep wrote it: the sweeper
    wrote its own over it before any job could see the lock.
    """

    def __init__(self) -> None:
        self.multirun: bytes | None = None
        self.started = 0
        self.refused_before = 0

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from kiln.experiments.jobs.lock import refused_dirs

        try:  # before the sweeper writes its own
            self.multirun = (Path(config.hydra.sweep.dir) / "multirun.yaml").read_bytes()
        except OSError:
            self.multirun = None
        self.started, self.refused_before = 0, len(refused_dirs)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.started += 1  # in this process: the basic launcher's jobs

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from kiln.experiments.jobs.lock import refused_dirs

        sweep_dir = Path(config.hydra.sweep.dir)
        refused = len(refused_dirs) - self.refused_before
        if self.multirun is not None and self.started and refused == self.started:
            from kiln.core.atomic import atomic_write

            atomic_write(sweep_dir / "multirun.yaml", self.multirun)
        jobs = scan_sweep(sweep_dir)
        show_table(sweep_table(str(sweep_dir), jobs))
        unfinished = (*FAILED_STATUSES, STOPPED)
        failed = [j.name for j in jobs if j.record is None or j.record.get("status") in unfinished]
        if failed:
            print(f"{len(failed)} of {len(jobs)} jobs failed: {', '.join(failed)}", file=sys.stderr)
            sys.exit(1)
