"""wandb's Fabric logger, minus a per-call cost (imported lazily: it imports wandb)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.fabric.loggers.logger import rank_zero_experiment
from wandb.integration.lightning.fabric import WandbLogger


class KilnWandbLogger(WandbLogger):
    """``wandb.integration.lightning.fabric.WandbLogger`` that looks its run up once.

    The stock ``experiment`` property re-labels the run and sends a telemetry record on
    every access, i.e. on every ``log_metrics``: ~50 ms a call on a busy CPU. Once the run
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
        if step is not None and self.skip_through is not None and step <= self.skip_through:
            return  # one row per step across a job's attempts
        super().log_metrics(metrics, step)

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        if self._experiment is None:  # a worker process: attach to the job's run once
            return WandbLogger.experiment.fget(self)
        return self._experiment
