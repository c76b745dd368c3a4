"""AdamW with weight-decay groups, and warm-up + cosine/linear/constant schedules."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the configs are read at compose time, where torch is not needed yet
    import torch
    from torch import nn

OPTIMIZERS = ("adamw",)
SCHEDULERS = ("cosine", "linear", "constant")
log = logging.getLogger(__name__)

MAX_LR = 1e30
"""Largest accepted learning rate or weight decay: far above any useful rate, and below
fp32's overflow (1e39 is inf in fp32: the run would fail later without naming the key)."""


@dataclass
class OptimizerConfig:
    """The optimizer. Biases and normalization weights never get weight decay."""

    name: str = "adamw"
    """``adamw``, the one optimizer kiln builds."""
    lr: float = 5e-5
    """Peak learning rate (reached at the end of warm-up)."""
    weight_decay: float = 0.01
    """Decoupled weight decay for the matrices (embeddings, linear and conv weights)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam's moving-average coefficients."""
    eps: float = 1e-8
    """Adam's denominator epsilon."""
    fused: bool = True
    """torch's fused AdamW kernel (one kernel per parameter, on the CPU and CUDA; HF
    ``Trainer``'s default): the same update as the per-tensor loop, to float rounding, at a
    fifth of its time on the CPU. ``false``: torch's default (``foreach`` on CUDA, the
    per-tensor loop on the CPU). A resumed run keeps the implementation its checkpoint
    was saved with (torch restores it with the optimizer's state)."""

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ValueError(f"optimizer.name={self.name!r} is not valid; choose: {OPTIMIZERS}")
        # `not (0 < x <= bound)` also catches NaN, which every comparison rejects.
        if not (0 < self.lr <= MAX_LR):
            raise ValueError(
                f"optimizer.lr={self.lr!r} is not valid; it must be a finite number in "
                f"(0, {MAX_LR:g}]"
            )
        if not (0 <= self.weight_decay <= MAX_LR):
            raise ValueError(
                f"optimizer.weight_decay={self.weight_decay!r} is not valid; it must be a "
                f"finite number in [0, {MAX_LR:g}]"
            )
        if not (0 < self.eps < 1):
            raise ValueError(f"optimizer.eps={self.eps!r} is not valid; it must be in (0, 1)")
        self.betas = tuple(float(b) for b in self.betas)  # Hydra hands over a list
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"optimizer.betas={self.betas!r} must be two floats in [0, 1)")


@dataclass
class SchedulerConfig:
    """The learning-rate schedule over the run's optimizer steps (``module.total_steps``)."""

    name: str = "cosine"
    """``cosine`` or ``linear`` decay after the warm-up, or ``constant``."""
    warmup_steps: int = 0
    """Linear warm-up steps from 0 to the peak; overrides ``warmup_ratio`` when > 0."""
    warmup_ratio: float = 0.0
    """Warm-up as a fraction of the total steps (used when ``warmup_steps`` is 0)."""
    min_lr_ratio: float = 0.0
    """The decay ends at ``lr * min_lr_ratio``."""

    def __post_init__(self) -> None:
        if self.name not in SCHEDULERS:
            raise ValueError(f"scheduler.name={self.name!r} is not valid; choose: {SCHEDULERS}")
        if self.warmup_steps < 0:
            raise ValueError(f"scheduler.warmup_steps={self.warmup_steps!r} must be >= 0")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"scheduler.warmup_ratio={self.warmup_ratio!r} must be in [0, 1)")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"scheduler.min_lr_ratio={self.min_lr_ratio!r} must be in [0, 1]")

    def warmup(self, total_steps: int) -> int:
        """Warm-up steps for a run of ``total_steps``."""
        return self.warmup_steps or math.ceil(self.warmup_ratio * total_steps)


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Split trainable parameters into a decayed group and a no-decay group.

    The split is timm's (``param_groups_weight_decay``): biases and every 1-D parameter (norm
    weights and scales) get no decay; matrices (embeddings, linear and conv weights) do.
    Tied weights appear once. Both groups exist, decay first, whatever ``weight_decay`` is,
    so optimizer checkpoints have one layout.
    """
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, param in model.named_parameters():  # a tied weight once, under its first name
        if param.requires_grad:
            (no_decay if param.ndim <= 1 or name.endswith(".bias") else decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, config: OptimizerConfig) -> torch.optim.Optimizer:
    """AdamW over ``model``'s trainable parameters, with weight-decay groups."""
    import torch

    groups = parameter_groups(model, config.weight_decay)
    fused = True if config.fused else None  # None: torch picks foreach or the loop
    return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, eps=config.eps, fused=fused)


def lr_factor(step: int, total_steps: int, config: SchedulerConfig) -> float:
    """The multiplier of the peak learning rate at optimizer step ``step``."""
    warmup = config.warmup(total_steps)
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if config.name == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    decay = 0.5 * (1 + math.cos(math.pi * progress)) if config.name == "cosine" else 1 - progress
    return config.min_lr_ratio + (1 - config.min_lr_ratio) * decay


_SAID: set[str] = set()  # warnings this process gave (kiln-train's config stage says it first)


def say_if_warmup_fills_the_run(config: SchedulerConfig, total_steps: int) -> None:
    """Warn (once per process) when the warm-up is not shorter than the run's
    ``total_steps``, naming both numbers: the learning rate never reaches its peak.

    A warning, not an error: a short debug run (debug=fast) of a long recipe is legitimate,
    but a real run whose rate never reaches its peak silently stays near chance.
    """
    warmup = config.warmup(total_steps)
    if warmup < total_steps:
        return
    peak = lr_factor(total_steps - 1, total_steps, config)
    source = (
        f"scheduler.warmup_steps={warmup}"
        if config.warmup_steps
        else f"scheduler.warmup_ratio={config.warmup_ratio} ({warmup} steps)"
    )
    message = (
        f"{source} is not shorter than the run's {total_steps} optimizer steps "
        "(trainer.max_steps, or fewer with max_epochs): the learning rate never reaches "
        f"its peak (it ends at {100 * peak:.0f}% of optimizer.lr) and never decays; use fewer "
        "warm-up steps or scheduler.warmup_ratio (e.g. 0.1)"
    )
    if message not in _SAID:
        _SAID.add(message)
        log.warning(message)


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: SchedulerConfig, total_steps: int | None
) -> torch.optim.lr_scheduler.LambdaLR:
    """A per-optimizer-step schedule; warm-up and decay need the run's ``total_steps``."""
    import torch

    if total_steps is None:
        if config.name != "constant" or config.warmup_steps or config.warmup_ratio:
            raise ValueError(
                f"scheduler {config.name!r} needs module.total_steps (set by kiln.core's loop "
                "before configure_optimizers); set it, or use scheduler.name='constant'"
            )
        total_steps = 1
    if total_steps < 1:
        raise ValueError(f"total_steps={total_steps!r} must be >= 1")
    say_if_warmup_fills_the_run(config, total_steps)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total_steps, config)
    )
