"""Activation checkpointing (``trainer.activation_checkpointing``): keep each repeated block's
inputs in the forward and recompute the rest of its activations in the backward.

It is applied to the module before anything else touches it (torchtitan's order:
activation checkpointing, compile, then sharding), and undone after the fit (except for
the wrappers FSDP2 sharded: they own their blocks' shards). How:

- A module that defines ``set_activation_checkpointing(enabled: bool)`` (the contract hook,
  ``kiln.core.module_contract``) does it itself: kiln.models' HF wrappers call the model's own
  non-reentrant ``activation_checkpointing_enable`` (``gradient_checkpointing_enable`` in
  older transformers), the timm wrapper ``set_grad_checkpointing``. A hook that cannot (a
  model without support) raises a ``ValueError`` that names the model.
- Any other module: every repeated block (found as regional compile finds them,
  :func:`kiln.core.blocks.repeated_blocks`) is wrapped in torch's non-reentrant
  ``checkpoint_wrapper`` in place. The wrapper's state dict has the block's own keys, so
  checkpoints are shared with runs without it.
- A module with neither fails before training, naming it and what is supported.

Recomputation runs the same operations on the same inputs (and restores the RNG state,
so dropout draws the same mask): gradients equal those without checkpointing.
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from typing import Any

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    CheckpointWrapper,
    checkpoint_wrapper,  # pyright: ignore[reportUnknownVariableType]  # checkpoint_fn unannotated
)
from torch.distributed.fsdp import FSDPModule

from kiln.core.blocks import repeated_blocks

HOOK = "set_activation_checkpointing"


@contextmanager
def activation_checkpointing(module: nn.Module, enabled: bool) -> Generator[str | None, None, None]:
    """For the duration of a fit: ``module`` with activation checkpointing on, if ``enabled``.

    Yields:
        How it was applied, for the telemetry: ``"<Class>.set_activation_checkpointing"``,
        ``"checkpoint_wrapper x <N> blocks"``, or ``None`` when not enabled.

    Raises:
        ValueError: ``enabled`` on a module that has no hook and no repeated blocks (or
            whose hook says its model cannot).
    """
    if not enabled:
        yield None
        return
    hook = getattr(module, HOOK, None)
    if callable(hook):
        hook(True)
        try:
            yield f"{type(module).__name__}.{HOOK}"
        finally:
            hook(False)
        return
    slots = _block_slots(module)
    if not slots:
        raise ValueError(
            f"trainer.activation_checkpointing=true but {type(module).__name__} cannot be "
            "checkpointed: it defines no set_activation_checkpointing(enabled) hook and has "
            "no repeated blocks (an nn.ModuleList or nn.Sequential of >= 2 blocks of one "
            "class). Supported: kiln.models' HF models (their own activation checkpointing), "
            "timm models (set_grad_checkpointing), and any module with repeated blocks "
            "(torch's checkpoint_wrapper per block); or set trainer.activation_checkpointing=false"
        )
    for container, index, block in slots:
        container[index] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    try:
        yield f"checkpoint_wrapper x {len(slots)} blocks"
    finally:
        for container, index, block in slots:
            wrapper = container[index]
            # a wrapper FSDP2 sharded owns the block's shards and hooks: it stays
            if isinstance(wrapper, CheckpointWrapper) and not isinstance(wrapper, FSDPModule):
                container[index] = block


@contextmanager
def paused(module: nn.Module, applied: str | None) -> Generator[None, None, None]:
    """``module`` without activation checkpointing for the block (``applied``: what
    :func:`activation_checkpointing` yielded). FLOPs are counted so: a model's FLOPs do not
    change with recomputation (MFU counts them once), and the HF models' checkpointed
    forward (``use_cache=False``) reads position values, which meta tensors do not have."""
    if applied is None:
        yield
        return
    hook = getattr(module, HOOK, None)
    if callable(hook):
        hook(False)
        try:
            yield
        finally:
            hook(True)
        return
    slots = [
        (child, i, wrapper)
        for child in module.modules()
        if isinstance(child, nn.ModuleList | nn.Sequential)
        for i, wrapper in enumerate(child)
        if isinstance(wrapper, CheckpointWrapper) and not isinstance(wrapper, FSDPModule)
    ]
    for container, index, wrapper in slots:
        container[index] = wrapper._checkpoint_wrapped_module  # pyright: ignore[reportPrivateUsage]  # the block it wraps
    try:
        yield
    finally:
        for container, index, wrapper in slots:
            container[index] = wrapper


def _block_slots(module: nn.Module) -> list[tuple[Any, int, nn.Module]]:
    """``(container, index, block)`` of every repeated block of ``module``."""
    wanted = {id(block) for block in repeated_blocks(module)}
    slots: list[tuple[Any, int, nn.Module]] = []
    for child in module.modules():
        if isinstance(child, nn.ModuleList | nn.Sequential):
            slots.extend((child, i, b) for i, b in enumerate(child) if id(b) in wanted)
    return slots
