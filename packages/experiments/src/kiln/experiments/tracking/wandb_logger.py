"""wandb's Fabric logger, minus a per-call cost (imported lazily: it imports wandb)."""

from __future__ import annotations

from typing import Any

from lightning.fabric.loggers.logger import rank_zero_experiment
from wandb.integration.lightning.fabric import WandbLogger


class KilnWandbLogger(WandbLogger):
    """``wandb.integration.lightning.fabric.WandbLogger`` that looks its run up once.

    The stock ``experiment`` property re-labels the run and sends a telemetry record on
    every access, i.e. on every ``log_metrics``: ~50 ms a call on a busy CPU. Once the run
    is known (given to the constructor, or attached in a worker process after unpickling)
    it is returned as is. Pickles like the stock logger: a worker attaches to the job's run.
    """

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        if self._experiment is None:  # a worker process: attach to the job's run once
            return WandbLogger.experiment.fget(self)
        return self._experiment
