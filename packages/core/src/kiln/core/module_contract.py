"""The module contract: what kiln.core's loop asks of a LightningModule.

The LightningModule defines the hooks and the Fabric loop calls them (the seed style):

- ``training_step(batch, batch_idx) -> {"loss": Tensor, "num_items": int | Tensor}``:
  the micro-batch's *mean* loss and how many items it averaged over (samples, or
  non-padding label tokens for language models). Extra keys are ignored.
- ``count_items(batch) -> int | Tensor`` (optional): the same count, computed from the
  batch alone. The loop pre-fetches a window of micro-batches and needs the window's
  item total *before* the first backward. Without the hook the count is the batch size
  (the first dimension of the first tensor in the batch); the loop checks, on the first
  window, that it agrees with what ``training_step`` reports.
- ``items_are_tokens = True`` (optional class attribute): the items are tokens, so the
  loop reports tokens/s from them (samples/s is always reported): the tokens the loss
  counts, so a padded and a packed run of the same documents compare.
- ``count_padding(batch) -> (padding positions, all positions)`` (optional): of a host
  batch (e.g. ``(attention_mask == 0).sum()`` and ``input_ids.numel()``); the loop reports
  ``padding_fraction`` of the measured steps from it (``kiln.core.telemetry.padding``).
- ``count_flops = False`` (optional attribute): skip the one FLOP count on meta tensors
  (for a ``training_step`` that reads tensor values, e.g. ``.item()``, which meta tensors
  lack); the run then reports no ``flops_per_step``/MFU. Without it such a step costs one
  INFO log line per run saying why the FLOPs were not counted.
- ``flops_batch(batch) -> batch`` (optional): the batch to count FLOPs on, when the step
  reads a value that does not change the FLOPs (HF's SDPA mask shortcut reads
  ``attention_mask.all()``: the HF wrappers count without the mask, the same matmuls).
- ``set_activation_checkpointing(enabled: bool)`` (optional): switch the model's own
  activation checkpointing on (before setup, with ``trainer.activation_checkpointing=true``)
  and off (after the fit); raise ``ValueError`` naming the model if it cannot. Without it
  the loop wraps each repeated block in torch's ``checkpoint_wrapper``
  (``kiln.core.loop.activation_checkpointing``).
- ``validation_step(batch, batch_idx) -> dict[str, Tensor]``: per-sample values, each
  tensor with the batch as its first dimension (predictions and labels, or per-sample
  loss sums and token counts). The loop concatenates them over the validation set,
  gathers them across ranks in dataset order (dropping the distributed sampler's
  padding duplicates) and hands them to:
- ``validation_metrics(outputs: dict[str, Tensor]) -> dict[str, float]``: the metrics
  of the whole validation set. Logged as ``val/<name>``.
- ``configure_optimizers()``: an optimizer, or ``{"optimizer": opt, "lr_scheduler": sched}``
  (``sched`` may also be Lightning's ``{"scheduler": sched, ...}``). The scheduler steps
  once per applied optimizer step; a dict asking for ``interval="epoch"``, a ``frequency``
  other than 1 or a ``monitor`` is rejected (``kiln.core.unpack_optimizers``). Before
  calling it the loop sets ``module.total_steps``: the optimizer steps the run will take,
  for warm-up and decay schedules.
- ``train_dataloader()`` / ``val_dataloader()``: map-style DataLoaders. The loop rebuilds
  the training loader's sampler so the data order depends only on (seed, epoch), which
  makes mid-epoch resume exact.
- ``on_*`` hooks: the module is the first listener at every callback point
  (``kiln.core.callback_points``: Lightning's ``on_fit_start``, ``on_before_backward(loss)``,
  ``on_after_backward()``, ``on_before_optimizer_step(optimizer)``,
  ``on_train_batch_end(outputs, batch, batch_idx)`` ..., and kiln's ``on_window_start``,
  ``on_step_end``, ``on_log`` ...), then every object passed to ``fit(callbacks=...)``.
- ``checkpoint_state() -> dict[str, Stateful]`` (optional): pieces of state the module owns
  beyond its weights (what its data was, say), saved in every checkpoint under their keys
  and restored on resume (``kiln.core.checkpoints.registry``).

The loop compiles the whole module (``torch.compile(module)``) before ``fabric.setup``;
Fabric routes ``training_step``/``validation_step`` through the compiled ``forward``,
so whatever they compute is compiled. Keep them free of ``.item()`` and Python-side
state that changes from step to step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import torch


def default_count_items(batch: Any) -> int:
    """Batch size of ``batch``: the first dimension of its first tensor."""
    tensor = _first_tensor(batch)
    if tensor is None:
        raise TypeError(
            f"cannot count the items of a batch of type {type(batch).__name__}: it holds no "
            "tensor; define count_items(batch) on the module"
        )
    return int(tensor.shape[0])


def count_items(module: Any, batch: Any) -> int | torch.Tensor:
    """Items in ``batch`` as the module counts them (``count_items`` hook or batch size)."""
    hook: Callable[[Any], int | torch.Tensor] | None = getattr(module, "count_items", None)
    return hook(batch) if callable(hook) else default_count_items(batch)


def as_dict(value: Any) -> dict[str, Any] | None:
    """``value`` if it is a dict (what a hook returned), typed for its string keys."""
    return cast(dict[str, Any], value) if isinstance(value, dict) else None


def _first_tensor(obj: Any) -> torch.Tensor | None:
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, Mapping):
        obj = list(cast(Mapping[Any, Any], obj).values())
    if isinstance(obj, Sequence) and not isinstance(obj, str):
        for item in cast(Sequence[Any], obj):
            found = _first_tensor(item)
            if found is not None:
                return found
    return None
