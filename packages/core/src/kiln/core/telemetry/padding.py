"""How much of what a run trained on was padding: the share of the measured steps' positions
(rows x length, every micro-batch, every rank) that held no real token.

A module that counts its padding defines ``count_padding(batch) -> (padding positions, all
positions)`` (``kiln.core.module_contract``); the loop counts each window on the host before
its step and :class:`~kiln.core.telemetry.step_timer.StepTimer` keeps the counts beside the
step's time, so the fraction covers exactly the steps ``tokens_per_s`` measures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import lightning as L
import torch

from kiln.core.telemetry.records import PaddingFigures
from kiln.core.telemetry.step_timer import Padding


def window_padding(module: Any, window: list[Any]) -> Padding | None:
    """(padding positions, all positions) of a window's host micro-batches, or ``None`` when
    the module does not count its padding."""
    hook: Callable[[Any], tuple[Any, Any]] | None = getattr(module, "count_padding", None)
    if not callable(hook):
        return None
    padding, positions = 0, 0
    for batch in window:
        pad, total = hook(batch)
        padding, positions = padding + int(pad), positions + int(total)
    return padding, positions


def padding_fraction(fabric: L.Fabric, counts: Padding | None) -> PaddingFigures:
    """``{"padding_fraction": ...}`` over all ranks from this rank's measured ``counts``; empty
    when the module counts no padding. A collective on several ranks: every rank calls it."""
    if counts is None:
        return {}
    if fabric.world_size > 1:
        both = torch.tensor(counts, dtype=torch.int64, device=fabric.device)
        summed = torch.as_tensor(fabric.all_reduce(both, reduce_op="sum"))  # pyright: ignore[reportUnknownMemberType]
        total = cast(list[int], summed.tolist())  # pyright: ignore[reportUnknownMemberType]
        counts = (total[0], total[1])
    padding, positions = counts
    return {"padding_fraction": padding / positions if positions > 0 else None}
