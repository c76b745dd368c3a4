"""Precision: the plugin kiln uses in place of Fabric's own, and step hooks run under it.

Fabric's ``64-true`` plugin casts every module output to torch's *default* dtype (float32
unless the user changed it), so a float64 run would weigh and log its losses in float32.
kiln's plugin keeps float64 outputs, making ``64-true`` exact to float64 rounding.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.fabric.plugins.precision import DoublePrecision

# lightning re-exports lightning_utilities' function, whose `function` is a bare Callable
from lightning.fabric.utilities.apply_func import (
    apply_to_collection,  # pyright: ignore[reportPrivateImportUsage, reportUnknownVariableType]
)


def _promote(tensor: torch.Tensor) -> torch.Tensor:
    """Floating tensors become at least the default dtype; none is ever down-cast."""
    if not torch.is_floating_point(tensor):
        return tensor
    return tensor.to(torch.promote_types(tensor.dtype, torch.get_default_dtype()))


class ExactDoublePrecision(DoublePrecision):
    """``64-true`` whose step outputs stay float64 (Fabric's casts them to float32)."""

    def convert_output(self, data: Any) -> Any:
        return apply_to_collection(data, dtype=torch.Tensor, function=_promote)


def call_step_hook(fabric: Any, model: Any, hook: str, *args: Any) -> Any:
    """Call a step hook (``training_step``, ``validation_step``) under Fabric's precision.

    Fabric applies precision (autocast, input/output dtypes) in ``forward``; it routes step
    hooks through ``forward`` only when the module is wrapped (DDP, compile), so on one
    eager device bf16-mixed would silently run in fp32. Applying it here too is harmless
    when Fabric already did. Under FSDP2 the hook goes through the root module's call
    (``sharding.through_root``), as the training step does.
    """
    from kiln.core.distributed.sharding import is_sharded, through_root
    from kiln.core.loop.step import call_under_precision

    fn = through_root(model, hook) if is_sharded(fabric.strategy) else getattr(model, hook)
    return call_under_precision(fabric.strategy.precision, fn, *args)
