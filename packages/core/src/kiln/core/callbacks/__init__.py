"""Callbacks for ``kiln.core.fit(callbacks=[...])``; see ``handle`` for the hooks they use."""

from typing import Any

from kiln.core.callbacks.best_checkpoint import BestCheckpoint
from kiln.core.callbacks.early_stopping import EarlyStopping
from kiln.core.callbacks.ema import EMA
from kiln.core.callbacks.handle import FitHandle
from kiln.core.callbacks.profiler import StepProfiler

__all__ = ["EMA", "BestCheckpoint", "EarlyStopping", "FitHandle", "StepProfiler"]


def __getattr__(name: str) -> Any:
    # the handle's old name keeps working, with a warning, for callbacks written against it
    if name == "Loop":
        import warnings

        warnings.warn(
            "kiln.core.callbacks.Loop is now kiln.core.callbacks.FitHandle",
            DeprecationWarning,
            stacklevel=2,
        )
        return FitHandle
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
