"""wandb's Fabric logger, minus a per-call cost, with whole-run figures in the summary
(imported lazily: it imports wandb)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import wandb.errors.term as _wandb_term
from lightning.fabric.loggers.logger import rank_zero_experiment

from kiln.experiments.tracking.wandb_files import row_kind

# Importing the integration warns that it was tested with Fabric 2.1.3 only; kiln's tests run
# it with the Fabric in uv.lock (tests/experiments/test_wandb_runs.py), so a newcomer's
# `make train` is not asked to decode it: the warning goes to wandb's debug log instead.
_shown, _wandb_term._show_warnings = _wandb_term._show_warnings, False
try:
    from wandb.integration.lightning.fabric import WandbLogger
finally:
    _wandb_term._show_warnings = _shown

SUMMARY_PREFIXES = ("telemetry/",)
"""Logged keys that go to the run's summary instead of its history."""


class KilnWandbLogger(WandbLogger):
    """``wandb.integration.lightning.fabric.WandbLogger`` that looks its run up once, and
    writes whole-run figures (:data:`SUMMARY_PREFIXES`) to the run's summary.

    The stock ``experiment`` property re-labels the run and sends a telemetry record on
    every access, i.e. on every ``log_metrics``, which costs tens of milliseconds. Once the run
    is known (given to the constructor, or attached in a worker process after unpickling)
    it is returned as is. Pickles like the stock logger: a worker attaches to the job's run.

    Args:
        skip_through: Drop rows of steps up to these, by kind (``train``, ``validation``,
            ``test``: ``wandb_files.row_kind``): a resumed job's W&B run already holds them
            (logged by the attempt before, past the checkpoint resumed from).
        **kwargs: The stock logger's arguments (``experiment=run``).
    """

    def __init__(self, *, skip_through: dict[str, int] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.skip_through = skip_through

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        # kiln.core logs a run's telemetry once, at its end: figures of the whole run belong
        # in the summary, not in one-point history rows (one empty-looking panel each)
        summary = {k: v for k, v in metrics.items() if k.startswith(SUMMARY_PREFIXES)}
        if summary:
            self.experiment.summary.update(summary)
            metrics = {k: v for k, v in metrics.items() if k not in summary}
            if not metrics:
                return
        if step is not None and self.skip_through:
            through = self.skip_through.get(row_kind(metrics))
            if through is not None and step <= through:
                return  # one row of each kind per step across a job's attempts
        super().log_metrics(metrics, step)

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        if self._experiment is None:  # a worker process: attach to the job's run once
            return WandbLogger.experiment.fget(self)
        return self._experiment
