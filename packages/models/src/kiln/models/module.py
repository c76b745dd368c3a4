"""``KilnModule``: the one LightningModule that implements kiln.core's contract.

Subclasses (HF and TIMM wrappers) only say how a batch becomes a loss, what validation
returns, and which metrics to compute; optimizers, schedules and data hooks live here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch

from kiln.models.optim import OptimizerConfig, SchedulerConfig, build_optimizer, build_scheduler


def at_least_fp32(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` promoted to float32 if it is of lower precision; float64 stays float64.

    Losses go through this instead of ``.float()``, which would down-cast a ``64-true`` run.
    """
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


class KilnModule(L.LightningModule):
    """Base class of kiln's model wrappers.

    Args:
        data: A kiln data module (``kiln.models.data``) or ``None``: a module without data
            still runs ``example_batch`` (benchmarks) but cannot build dataloaders.
        optimizer: AdamW settings; decay groups skip biases and norms.
        scheduler: Warm-up and decay over ``total_steps`` (set by the loop).
    """

    task: str = ""

    def __init__(
        self,
        data: Any = None,
        optimizer: OptimizerConfig | None = None,
        scheduler: SchedulerConfig | None = None,
    ) -> None:
        super().__init__()
        self.optimizer_config = optimizer or OptimizerConfig()
        self.scheduler_config = scheduler or SchedulerConfig()
        self.total_steps: int | None = None
        self.data_module = data

    def _attach_data(self) -> None:
        """Let the data module check itself against the built model (call at the end of init)."""
        if self.data_module is not None:
            self.data_module.attach(self)

    # -- the contract -------------------------------------------------------------------
    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict[str, Any]:
        loss, num_items = self.loss_and_count(batch)
        return {"loss": loss, "num_items": num_items}

    def loss_and_count(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any]:
        """The batch's mean loss and the number of items it averages over."""
        raise NotImplementedError

    def count_items(self, batch: dict[str, torch.Tensor]) -> int | torch.Tensor:
        """Items in ``batch`` (samples by default), without running the model."""
        return int(batch["labels"].shape[0])

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict:
        raise NotImplementedError

    def validation_metrics(self, outputs: dict[str, torch.Tensor]) -> dict[str, float]:
        raise NotImplementedError

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = build_optimizer(self, self.optimizer_config)
        scheduler = build_scheduler(optimizer, self.scheduler_config, self.total_steps)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return self._require_data().train_dataloader()

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return self._require_data().val_dataloader()

    # -- export ---------------------------------------------------------------------------
    def export(self, out_dir: str | Path) -> Path:
        """Write the model so its own library loads it without kiln.

        Args:
            out_dir: The directory to write (created; files in it are overwritten).

        Returns:
            ``out_dir``.

        Raises:
            NotImplementedError: The wrapper has no export format.
        """
        raise NotImplementedError(
            f"{type(self).__name__} has no export; implement KilnModule.export(out_dir) "
            "(HFModule and TimmClassifier do)"
        )

    def load_export(self, out_dir: str | Path) -> None:
        """Load the weights of an ``export(out_dir)`` of this model into it.

        Raises:
            NotImplementedError: The wrapper has no export format.
        """
        raise NotImplementedError(f"{type(self).__name__} has no export to load")

    # -- helpers --------------------------------------------------------------------------
    def example_batch(
        self, batch_size: int, device: torch.device | str | None = None
    ) -> dict[str, torch.Tensor]:
        """A fixed-shape synthetic batch (benchmarks, tests); needs no data module."""
        raise NotImplementedError

    def _require_data(self) -> Any:
        if self.data_module is None:
            raise RuntimeError(
                f"{type(self).__name__} has no data module; pass data=... to create_model "
                "(see kiln.models.data), or use example_batch() for synthetic batches"
            )
        return self.data_module
