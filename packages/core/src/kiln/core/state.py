"""The run's state types: what ``setup`` built for it (:class:`Context`, fixed for the run),
where it stands (:class:`RunState`, what checkpoints carry) and what it returns
(:class:`FitResult`).

Only the types: importing them imports neither torch nor Fabric.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import lightning as L
    import torch
    from torch.utils.data import DataLoader

    from kiln.core.callback_points import CallbackList
    from kiln.core.checkpoints.registry import CheckpointState
    from kiln.core.config import TrainerConfig
    from kiln.core.telemetry.records import Telemetry


@dataclass
class FitResult:
    """What a run returns (on every rank)."""

    global_step: int
    epoch: int
    metrics: dict[str, float] = field(default_factory=dict)
    train_loss: float | None = None
    telemetry: Telemetry = field(default_factory=lambda: {})
    history: list[dict[str, Any]] = field(default_factory=list)
    # each validation's metrics with its "step" (carried in checkpoints, like history)
    validation_history: list[dict[str, Any]] = field(default_factory=list)
    checkpoint: str | None = None
    # "max_steps", "max_epochs", "signal" (see kiln.core.distributed.stop), or the reason a callback
    # gave loop.request_stop(reason)
    stop_reason: str | None = None
    # with stop_reason "signal": the signal that stopped it at a step boundary ("SIGTERM")
    stop_signal: str | None = None
    run_id: str | None = None  # the run's id in its checkpoint dir's run.json and checkpoints
    # with trainer.allow_changed_state: the checkpoint's state this attempt dropped and the
    # callbacks' state it started fresh ("callbacks/EMA"), as the resume said
    changed_state: list[str] = field(default_factory=list)


_SAVED = ("global_step", "epoch", "batch_in_epoch", "skipped_steps")


@dataclass
class RunState:
    """Where the run stands; a ``Stateful``, registered as the checkpoints' ``"loop"``."""

    global_step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # micro-batches of the current epoch already trained on
    skipped_steps: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    validation_history: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    checkpoint: str | None = None  # the newest checkpoint this run wrote
    lr: float | None = None  # the learning rate the latest step used
    stop_reason: str | None = None  # a callback asked the run to stop (saved: resume stays stopped)
    stop_signal: str | None = None  # a signal stopped it at a step boundary (never saved)
    run_id: str | None = None  # set by the resume stage: kept across restarts
    changed_state: list[str] = field(default_factory=list)  # the resume's (never saved)
    micro_batch_flops: int | None = None  # forward + backward FLOPs of one micro-batch
    grad_bytes: int | None = None  # this rank's gradients, read at the first step (never saved)
    precision_audit: dict[str, Any] | None = None  # trainer.precision_audit's record (never saved)
    stop_requested: int = 0  # a signal the stop poll agreed on, this step (never saved)
    started_at: float = field(default_factory=time.perf_counter)  # fit's start (never saved)

    def state_dict(self) -> dict[str, Any]:
        return {
            "global_step": self.global_step,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "skipped_steps": self.skipped_steps,
            "history": list(self.history),
            "validation_history": list(self.validation_history),
            "metrics": dict(self.metrics),
            "stop_reason": self.stop_reason,
            "run_id": self.run_id,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in _SAVED:
            setattr(self, key, int(state[key]))
        self.history = list(state.get("history", []))
        self.validation_history = list(state.get("validation_history", []))
        self.metrics = dict(state.get("metrics", {}))
        self.stop_reason = state.get("stop_reason")
        self.run_id = state.get("run_id")

    def result(self, telemetry: Telemetry | None = None) -> FitResult:
        """The run so far as a :class:`FitResult` (copies: the run may go on)."""
        return FitResult(
            global_step=self.global_step,
            epoch=self.epoch,
            metrics=dict(self.metrics),
            train_loss=self.history[-1]["train/loss"] if self.history else None,
            telemetry=telemetry.copy() if telemetry else {},
            history=list(self.history),
            validation_history=list(self.validation_history),
            checkpoint=self.checkpoint,
            stop_reason=self.stop_reason,
            stop_signal=self.stop_signal,
            run_id=self.run_id,
            changed_state=list(self.changed_state),
        )


@dataclass
class Context:
    """What ``setup`` built for the run."""

    fabric: L.Fabric
    trainer: TrainerConfig
    module: L.LightningModule  # the module as given (hooks, count_items)
    model: torch.nn.Module  # the Fabric-wrapped (and maybe compiled) module that runs the steps
    # model.training_step, resolved once: Fabric's wrapper looks it up through several
    # __getattr__ calls (tens of microseconds), and the callable it returns is reusable
    training_step: Callable[..., Any]
    # Fabric's wrapper (at run time an instance of the torch optimizer's own class)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    scaler: torch.amp.GradScaler | None  # the GradScaler of 16-mixed, else None
    train_loader: DataLoader[Any]
    val_loader: DataLoader[Any] | None
    batches_per_epoch: int
    total_steps: int
    has_count_hook: bool  # the module defines count_items (else items = batch size)
    count_flops: bool  # trainer.count_flops, unless the module says count_flops = False
    callbacks: CallbackList  # the module, kiln's observers, the user's callbacks
    state: CheckpointState  # what every checkpoint holds
    activation_checkpointing: str | None = None  # how it was applied (None: off)
    start_memory_mb: float | None = None  # held when the fit began (its peak counts from there)
    # compiled with CUDA graphs on a CUDA device: each training or validation forward begins
    # a new graph step, since accumulation and validation replay the graphs within one step
    cuda_graphs: bool = False
