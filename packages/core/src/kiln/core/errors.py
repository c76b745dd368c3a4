"""Why a run stops: the exceptions ``fit`` raises for a broken run, and the checks behind them."""

from __future__ import annotations

from typing import Any

import torch


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite; the run stops before saving it."""


class NonFiniteWeightsError(NonFiniteLossError):
    """The weights became NaN or infinite (the step's loss, computed before the update, was
    finite); the run stops before saving them."""


class NonFiniteGradientError(NonFiniteLossError):
    """The gradient norm became NaN or infinite under gradient clipping."""


class EmptyWindowError(ValueError):
    """A window's micro-batches hold no items to average over (e.g. every label is -100)."""


class EmptyEpochError(ValueError):
    """An epoch yields no micro-batch from where the run stands: a resumed run skipped past
    the end of a shorter epoch (the data or batch size changed since the checkpoint)."""


def check_finite_weights(fabric: Any, model: torch.nn.Module, step: int) -> None:
    """Raise :class:`NonFiniteWeightsError` if any parameter of ``model`` is NaN or infinite.

    A non-finite weight makes its tensor's sum non-finite: one sum per parameter, stacked,
    and a host sync (with several ranks, whose shards may differ, an all-reduce of the
    count and a second sync); the exact count, for the message, only where a sum is not
    finite (or overflowed), which costs a fraction of counting every time.
    """
    from kiln.core.dtensor import local_tensor

    # sharded parameters (DTensors): each rank counts its own shard, the sum covers them all
    params = [local_tensor(p.detach()) for p in model.parameters()]
    if not params:
        return
    sums = torch.stack([p.sum().float() for p in params])
    if bool(sums.isfinite().all()):  # the host sync
        bad = torch.zeros((), dtype=torch.int64, device=sums.device)
    else:
        bad = torch.stack([(~p.isfinite()).sum() for p in params]).sum()
    if fabric.world_size > 1:
        bad = fabric.all_reduce(bad, reduce_op="sum")
    count = int(bad)
    if count:
        raise NonFiniteWeightsError(
            f"{count} model weights are NaN or infinite after step {step} (its loss was "
            "finite: the update itself overflowed, e.g. too high a learning rate or fp16 "
            "range); stopping before they reach a checkpoint (the last good checkpoint stays)"
        )
