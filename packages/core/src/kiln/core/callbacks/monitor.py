"""What the metric-watching callbacks share: reading the monitored metric, comparing values."""

from __future__ import annotations

import math
from typing import Any

MODES = ("min", "max")


def check_mode(owner: str, mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"{owner}: mode={mode!r} is not valid; use 'min' or 'max'")


def require_validation(owner: str, fit: Any) -> None:
    """Fail at the start of the run, not silently at its end, when nothing is validated."""
    if not fit.validates:
        raise ValueError(
            f"{owner} watches a validation metric, but the module does not validate: define "
            "val_dataloader() and validation_step(batch, batch_idx) on it"
        )


def monitored(owner: str, monitor: str, metrics: dict[str, float]) -> float:
    """``metrics[monitor]``, or an error naming the key and the ones there are."""
    if monitor not in metrics:
        raise ValueError(
            f"{owner}: monitor={monitor!r} is not among the validation metrics; "
            f"available: {sorted(metrics)}"
        )
    return float(metrics[monitor])


def improves(value: float, best: float | None, mode: str, min_delta: float = 0.0) -> bool:
    """Whether ``value`` beats ``best`` by more than ``min_delta``; a non-finite one never does."""
    if not math.isfinite(value):
        return False
    if best is None:
        return True
    return value < best - min_delta if mode == "min" else value > best + min_delta
