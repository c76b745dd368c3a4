"""Callbacks for ``kiln.core.fit(callbacks=[...])``; see ``base`` for the hooks they use."""

from kiln.core.callbacks.best_checkpoint import BestCheckpoint
from kiln.core.callbacks.early_stopping import EarlyStopping
from kiln.core.callbacks.ema import EMA
from kiln.core.callbacks.handle import Loop

__all__ = ["EMA", "BestCheckpoint", "EarlyStopping", "Loop"]
