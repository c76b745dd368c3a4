"""Hydra callbacks: the start-of-sweep check of every job's config, the end-of-sweep check that
makes a sweep with a failed job exit non-zero, the start-of-sweep check that a study optimizes
the way its metric says, and the start-of-run check that the output directory is not a file.

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


class SweepConfigCheck(Callback):
    """Before a sweep writes anything or starts a job: every job's config, composed as its
    launcher will compose it, passes the command's config-stage check, or the sweep exits
    (status 1) naming each bad job (:mod:`kiln.experiments.jobs.sweep_check`). Listed first
    in ``configs/hydra/default.yaml``, so no other callback has touched the sweep directory."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from kiln.experiments.jobs.sweep_check import check_sweep

        check_sweep(config)


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
    """Print the sweep's jobs at its end; exit non-zero if any failed or was refused.

    A job refused in an earlier job's directory writes nothing there (its record stays that
    job's) and leaves a note in the sweep directory (:func:`job_files.note_refusal`), which
    this check names. The sweeper writes its ``multirun.yaml`` before any job starts: a sweep
    none of whose jobs took its directory (all refused or skipped) puts the earlier one back,
    so it still describes the sweep that trained the jobs.
    """

    def __init__(self) -> None:
        self.multirun: bytes | None = None
        self.hydra_stamps: dict[Path, tuple[int, int]] = {}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from kiln.experiments.settings import job_files

        sweep_dir = Path(config.hydra.sweep.dir)
        try:  # before the sweeper writes its own
            self.multirun = (sweep_dir / "multirun.yaml").read_bytes()
        except OSError:
            self.multirun = None
        self.hydra_stamps = _hydra_stamps(sweep_dir)
        job_files.clear_refusals(sweep_dir)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from kiln.experiments.settings import job_files

        sweep_dir = Path(config.hydra.sweep.dir)
        if self.multirun is not None and _hydra_stamps(sweep_dir) == self.hydra_stamps:
            from kiln.core.atomic import atomic_write

            atomic_write(sweep_dir / "multirun.yaml", self.multirun)  # no job of this sweep ran
        jobs = scan_sweep(sweep_dir)
        show_table(sweep_table(str(sweep_dir), jobs))
        refused = job_files.read_refusals(sweep_dir)
        unfinished = (*FAILED_STATUSES, STOPPED)
        failed = [j.name for j in jobs if j.record is None or j.record.get("status") in unfinished]
        failed += [str(n["job"]) for n in refused if str(n["job"]) not in failed]
        for note in refused:
            print(f"job {note['job']} refused: {note['error']}", file=sys.stderr)
        if failed:
            print(f"{len(failed)} of {len(jobs)} jobs failed: {', '.join(failed)}", file=sys.stderr)
            sys.exit(1)


def _hydra_stamps(sweep_dir: Path) -> dict[Path, tuple[int, int]]:
    """Each job's ``.hydra/config.yaml`` (inode, mtime): a run that took its job directory
    wrote it anew (no clock compared: SLURM nodes may disagree on the time)."""
    stamps = {}
    for path in sweep_dir.rglob(".hydra/config.yaml"):
        try:
            stat = path.stat()
        except OSError:
            continue
        stamps[path] = (stat.st_ino, stat.st_mtime_ns)
    return stamps
