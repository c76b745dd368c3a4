"""Validation: run ``validation_step`` over the val loader, gather outputs in dataset order
across ranks, and turn them into ``val/`` metrics, leaving training's random streams alone."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

import torch

from kiln.core.checkpoints.rng import capture_rng_state, restore_rng_state
from kiln.core.distributed.stop import stop_requested_in_validation
from kiln.core.loop.data import dataset_size, gather_in_order
from kiln.core.loop.precision import call_step_hook
from kiln.core.loop.step import kept
from kiln.core.state import Context


def validate(ctx: Context, step: int) -> dict[str, float] | None:
    """Validate and log the metrics at ``step``; ``None`` when the module does not validate."""
    fabric, module = ctx.fabric, ctx.module
    if ctx.val_loader is None or not callable(getattr(module, "validation_step", None)):
        return None
    ctx.callbacks("on_validation_start")
    # Validation must not shift training's random streams (a val loader's iterator draws a
    # seed), so a run validated at step N trains exactly as one that was not.
    rng = capture_rng_state()
    outputs = _validation_outputs(ctx)
    restore_rng_state(rng)
    if outputs is None:  # a signal ended it: no metrics, the run stops at this step
        fabric.print(f"validation at step {step} stopped before its end: no metrics recorded")
        ctx.callbacks("on_validation_end")  # the stop poll takes the request here
        return None
    size = dataset_size(ctx.val_loader)
    gathered = {k: gather_in_order(fabric, torch.cat(v), size) for k, v in outputs.items()}
    compute: Callable[[dict[str, torch.Tensor]], Mapping[str, Any]] | None = getattr(
        module, "validation_metrics", None
    )
    if callable(compute):
        metrics = compute(gathered)
    elif "loss" in gathered:
        metrics = {"loss": gathered["loss"].float().mean().item()}
    else:
        raise TypeError("define validation_metrics(outputs) on the module, or return 'loss'")
    metrics = {f"val/{k}": float(v) for k, v in metrics.items()}
    fabric.log_dict(metrics, step=step)
    ctx.callbacks("on_validation_end")
    return metrics


def _validation_outputs(ctx: Context) -> dict[str, list[torch.Tensor]] | None:
    """This rank's ``validation_step`` outputs, by key, in eval mode and without grad;
    ``None`` when a signal stopped it (``stop_requested_in_validation``)."""
    limit = ctx.trainer.limit_val_batches
    assert ctx.val_loader is not None  # validate() returns first without one
    outputs: dict[str, list[torch.Tensor]] = defaultdict(list)
    ctx.model.eval()
    with torch.no_grad():
        for i, batch in enumerate(ctx.val_loader):
            if limit is not None and i >= limit:
                break
            if ctx.cuda_graphs:  # a new graph step: the last batch's outputs were copied
                torch.compiler.cudagraph_mark_step_begin()
            out = call_step_hook(ctx.fabric, ctx.model, "validation_step", batch, i)
            for key, value in out.items():
                outputs[key].append(kept(value, ctx.cuda_graphs))
            if stop_requested_in_validation():  # SIGTERM or Ctrl-C: end it here
                ctx.model.train()
                return None
    ctx.model.train()
    return outputs
