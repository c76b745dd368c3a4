"""wandb's Fabric logger, minus a per-call cost, with whole-run figures in the summary
(imported lazily: it imports wandb)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.fabric.loggers.logger import rank_zero_experiment
from wandb.integration.lightning.fabric import WandbLogger

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
        skip_through: Drop rows of steps up to this one: a resumed job's W&B run already
            holds them (logged by the attempt before, past the checkpoint resumed from).
        **kwargs: The stock logger's arguments (``experiment=run``).
    """

    def __init__(self, *, skip_through: int | None = None, **kwargs: Any) -> None:
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
        if step is not None and self.skip_through is not None and step <= self.skip_through:
            return  # one row per step across a job's attempts
        super().log_metrics(metrics, step)

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        if self._experiment is None:  # a worker process: attach to the job's run once
            return WandbLogger.experiment.fget(self)
        return self._experiment
