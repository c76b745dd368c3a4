"""One optimizer step: forward and backward over a window of micro-batches, then the update.

The window's loss is the sum of per-item losses over every micro-batch and rank divided by
the window's item count over all ranks, so the update equals that of one batch holding all
of them. Item counts are exact: host integers on the one-process path, float64 tensors
(float32 on MPS, which has no float64) when they live on the device or cross ranks.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, cast

import lightning as L
import torch

from kiln.core.errors import NonFiniteGradientError, check_window_total
from kiln.core.loop.first_step import LATER_STEPS, StepExtras
from kiln.core.loop.precision import call_under_precision
from kiln.core.module_contract import as_dict, count_items, default_count_items
from kiln.core.state import Context, RunState

_AT_LEAST_FP32 = (torch.float32, torch.float64)


@dataclass
class StepOutput:
    """A finished optimizer step whose loss still lives on the device."""

    step: int
    # this rank's detached mean loss and item count per micro-batch: weighted and summed
    # in float64 at the next sync point (window_loss_sums), not in tensor ops every step
    losses: list[torch.Tensor]
    counts: list[int | torch.Tensor]
    total: int | torch.Tensor  # items in the window over all ranks
    grad_norm: torch.Tensor | None  # with clipping only


def train_step(
    ctx: Context, run: RunState, window: list[Any], extras: StepExtras = LATER_STEPS
) -> StepOutput:
    """Train on ``window`` (host micro-batches) and take one optimizer step; advance ``run``.
    ``extras``: the first step's one-off work (:class:`~kiln.core.loop.first_step.FirstStep`)."""
    extras.before(window)
    ctx.timer.start()
    with extras.around_window():
        losses, items, total, samples, last = train_window(ctx, window, run.batch_in_epoch)
    extras.after_backward(window, items)
    step = run.global_step + 1
    grad_norm, skipped, run.lr = optimizer_step(ctx, step, total)
    run.skipped_steps += skipped
    run.global_step = step
    run.batch_in_epoch += len(window)
    ctx.hooks("on_train_batch_end", *last)  # as in Lightning: after the window's step
    if run.batch_in_epoch >= ctx.batches_per_epoch:
        ctx.fabric.call("on_train_epoch_end")
        run.epoch += 1
        run.batch_in_epoch = 0
    ctx.timer.stop(samples * ctx.fabric.world_size, total if ctx.counts_tokens else None)
    return StepOutput(step, losses, items, total, grad_norm)


def train_window(
    ctx: Context, window: list[Any], first_batch_idx: int
) -> tuple[list[torch.Tensor], list[Any], int | torch.Tensor, int, tuple[Any, Any, int]]:
    """Forward and backward every micro-batch of a window.

    Each micro-batch's mean loss is weighted by its share of the window's items over all
    ranks, so the accumulated gradient is that of one batch holding the whole window. The
    window arrives on the host, where its items are counted; each micro-batch goes to the
    device just before its forward (the next one's copy is issued first, to overlap), so
    device memory holds at most two micro-batches whatever ``accumulate_grad_batches`` is.

    Returns:
        This rank's detached mean loss and ``num_items`` of each micro-batch, the window's
        items over all ranks, this rank's samples in the window, and the
        ``on_train_batch_end`` arguments of the last micro-batch (``outputs, host batch,
        batch_idx``): that hook runs after the step.
    """
    fabric, model = ctx.fabric, ctx.model
    counts, samples = _host_counts(ctx, window)
    total = _window_total(fabric, counts)
    # even on the CPU: a batch type's own .to() may do more than move tensors
    step_fn, precision, to_device = ctx.training_step, fabric.strategy.precision, fabric.to_device
    last = len(window) - 1
    losses: list[torch.Tensor] = []
    items: list[Any] = []
    out: Any = None  # the window has at least one micro-batch
    # as object: Any would match all three overloads of to_device, whose results differ
    upcoming = to_device(cast(object, window[0]))
    for j in range(len(window)):
        batch, upcoming = upcoming, to_device(cast(object, window[j + 1])) if j < last else None
        # Gradients are all-reduced once per window, on its last micro-batch.
        # (Fabric annotates no_backward_sync with a bare AbstractContextManager and its module
        # with its private wrapper class, which fabric.setup returned)
        no_sync = (
            cast("AbstractContextManager[None]", fabric.no_backward_sync(model, enabled=True))  # pyright: ignore[reportUnknownMemberType, reportArgumentType]
            if j < last
            else nullcontext()
        )
        with no_sync:
            if ctx.cuda_graphs:  # a new graph step: the last one's outputs were read
                torch.compiler.cudagraph_mark_step_begin()
            out = call_under_precision(precision, step_fn, batch, first_batch_idx + j)
            del batch  # the graph holds what backward needs; the batch itself can go
            loss, n = _unpack_step(out)
            # DDP averages gradients over ranks, hence * world: the sum runs over all items.
            weighted = _weighted(loss, n, fabric.world_size, total)
            ctx.hooks("on_before_backward", weighted)
            fabric.backward(weighted)
            if ctx.cuda_graphs and j == 0 and last > 0:
                _own_grads(ctx.module)
            ctx.hooks("on_after_backward")
        losses.append(ctx.kept(loss))
        items.append(ctx.kept(n) if isinstance(n, torch.Tensor) else n)
        if j < last:  # the hook gets the host batch: the device copy is already freed
            ctx.hooks("on_train_batch_end", out, window[j], first_batch_idx + j)
    return losses, items, total, samples, (out, window[last], first_batch_idx + last)


def _own_grads(module: torch.nn.Module) -> None:
    """Copy the gradients out of the CUDA graphs' memory pool: a first backward hands its
    output over as ``.grad``, which the next micro-batch's replay overwrites before the
    later backwards add to it."""
    for p in module.parameters():
        if p.grad is not None:
            p.grad = p.grad.clone()


def _host_counts(ctx: Context, window: list[Any]) -> tuple[list[int | torch.Tensor], int]:
    """Items of each (host) micro-batch, and the window's samples (batch sizes).

    A count the hook returns as a CPU tensor is read now: a host integer is exact and free.
    """
    samples = [default_count_items(b) for b in window]
    if not ctx.has_count_hook:
        return list(samples), sum(samples)
    counts = [count_items(ctx.module, b) for b in window]
    counts = [
        int(c) if isinstance(c, torch.Tensor) and c.device.type == "cpu" else c for c in counts
    ]
    return counts, sum(samples)


def _window_total(fabric: L.Fabric, counts: list[int | torch.Tensor]) -> int | torch.Tensor:
    """Items in the window over all ranks."""
    if fabric.world_size == 1 and all(isinstance(c, int) for c in counts):
        return sum(counts)  # host integers: no device work on the common one-process path
    total = torch.stack([as_count_tensor(c, fabric.device) for c in counts]).sum()
    if fabric.world_size > 1:
        total = all_reduce_sum(fabric, total)
    return total


def all_reduce_sum(fabric: L.Fabric, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` summed over all ranks: ``fabric.all_reduce``, typed for a tensor (Fabric
    annotates it for any collection, with bare generics)."""
    return cast(torch.Tensor, fabric.all_reduce(tensor, reduce_op="sum"))  # pyright: ignore[reportUnknownMemberType]


def _weighted(loss: torch.Tensor, n: Any, world: int, total: Any) -> torch.Tensor:
    """``loss * n * world / total``, kept at least fp32 (also for a bf16/fp16 loss)."""
    if loss.dtype not in _AT_LEAST_FP32:  # checked first: a no-op .to() still costs a call
        loss = loss.to(torch.promote_types(loss.dtype, torch.float32))
    if isinstance(n, int) and isinstance(total, int):
        weight = n * world / total  # exact host arithmetic; 1.0 needs no multiply at all
        return loss if weight == 1.0 else loss * weight
    weight = as_count_tensor(n, loss.device) * world / as_count_tensor(total, loss.device)
    return loss * weight.to(loss.dtype)


def optimizer_step(
    ctx: Context, step: int, total: int | torch.Tensor
) -> tuple[torch.Tensor | None, bool, float]:
    """Clip, step, schedule, zero.

    Returns:
        The grad norm (with clipping), whether the GradScaler skipped the step, and the
        learning rate the step used (read before the scheduler moves it on).
    """
    optimizer, scaler = ctx.optimizer, ctx.scaler
    if isinstance(total, int):
        check_window_total(total, step)  # host integer: free to check before the update
    ctx.hooks("on_before_optimizer_step", optimizer)  # as in Lightning: before clipping
    grad_norm = _clip(ctx, step, total)
    lr = float(optimizer.param_groups[0]["lr"])  # a tensor lr (compiled optimizers) is read here
    scale_before = scaler.get_scale() if scaler is not None else None
    optimizer.step()
    # note: get_scale() is a host sync, paid only with 16-mixed's GradScaler. A lower scale
    # means it found inf/NaN gradients and skipped the update: the schedule must not advance.
    skipped = scale_before is not None and scaler is not None and scaler.get_scale() < scale_before
    if ctx.scheduler is not None and not skipped:
        ctx.scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, skipped, lr


def _clip(ctx: Context, step: int, total: int | torch.Tensor) -> torch.Tensor | None:
    """Clip the gradient norm if ``trainer.gradient_clip_norm`` says so; return the norm."""
    max_norm = ctx.trainer.gradient_clip_norm
    if max_norm is None:
        return None
    try:
        # inf/NaN gradients are expected with 16-mixed: the GradScaler skips those steps
        return ctx.fabric.clip_gradients(
            ctx.model, ctx.optimizer, max_norm=max_norm, error_if_nonfinite=ctx.scaler is None
        )
    except RuntimeError as error:
        if "non-finite" not in str(error):
            raise
        check_window_total(int(total), step)  # an empty window makes 0/0 gradients
        raise NonFiniteGradientError(
            f"gradient norm is {_grad_norm(ctx.optimizer)} at step {step} (before clipping to "
            f"trainer.gradient_clip_norm={max_norm}); stopping before it "
            "reaches a checkpoint (the last good checkpoint stays)"
        ) from error


def _grad_norm(optimizer: Any) -> float:
    """The global 2-norm of the gradients (on a failure path: a host sync is fine)."""
    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    if not grads:
        return float("nan")
    total = torch.nn.utils.get_total_norm(grads)
    # FSDP's sharded gradients give a DTensor: the global norm needs every rank's part
    from torch.distributed.tensor import DTensor

    return float(total.full_tensor() if isinstance(total, DTensor) else total)


def _unpack_step(out: Any) -> tuple[torch.Tensor, Any]:
    step_out = as_dict(out)
    if step_out is None or "loss" not in step_out or "num_items" not in step_out:
        raise TypeError(
            "training_step must return {'loss': mean loss, 'num_items': items it averaged "
            f"over}}, got {type(out).__name__}"
            + (f" with keys {sorted(step_out)}" if step_out is not None else "")
        )
    return step_out["loss"], step_out["num_items"]


def count_dtype(device: torch.device) -> torch.dtype:
    """Item counts as exact floats: float64 holds any count (MPS has no float64)."""
    return torch.float32 if device.type == "mps" else torch.float64


def as_count_tensor(value: Any, device: torch.device) -> torch.Tensor:
    """``value`` (an item count or a sum of losses) as an exact tensor on ``device``."""
    return torch.as_tensor(value, device=device).to(count_dtype(device))


def window_loss_sums(outputs: list[StepOutput], device: torch.device) -> torch.Tensor:
    """This rank's sum of per-item losses over each step's window, exact in float64.

    Every micro-batch's mean loss times its item count, summed per window in micro-batch
    order (the same roundings whatever steps are read together): a few tensor ops for all
    the steps since the last sync point instead of several every micro-batch.
    """
    dtype = count_dtype(device)
    losses = torch.stack([loss for out in outputs for loss in out.losses]).to(dtype)
    counts = [n for out in outputs for n in out.counts]
    if all(isinstance(n, int) for n in counts):
        items = torch.tensor(counts, dtype=dtype, device=losses.device)
    else:
        items = torch.stack([as_count_tensor(n, losses.device) for n in counts])
    weighted = losses * items
    lengths = [len(out.losses) for out in outputs]
    width = max(lengths)
    if min(lengths) == width:
        table = weighted.view(len(outputs), width)
    else:  # a short last window of an epoch: pad with zeros, which add exactly nothing
        mask = torch.tensor([[c < n for c in range(width)] for n in lengths])
        table = weighted.new_zeros(len(outputs), width)
        table[mask.to(table.device)] = weighted
    sums = table[:, 0]
    for c in range(1, width):
        sums = sums + table[:, c]
    return sums
