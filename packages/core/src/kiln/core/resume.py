"""The resume stage of ``fit``: find and load the checkpoint to continue from, and put the
training iterator where the checkpointed run stood (skip what it had consumed, then restore
its random streams)."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from kiln.core.checkpoint import find_latest_checkpoint, load_checkpoint, restore_rng_state
from kiln.core.config import TrainerConfig
from kiln.core.setup import Context
from kiln.core.state import RunState


def resume(ctx: Context, run: RunState) -> dict[str, Any] | None:
    """Load the checkpoint ``trainer.resume`` names, if any, into ``ctx``'s objects and ``run``.

    Returns:
        This rank's saved RNG state, for :func:`position` to restore once the iterator
        stands where the checkpointed run stood; ``None`` for a fresh run.
    """
    path = checkpoint_to_resume(ctx.trainer)
    if path is None:
        return None
    rest = load_checkpoint(ctx.fabric, path, ctx.objects)
    run.load(rest)
    ctx.fabric.print(f"resumed from {path} at step {run.global_step}")
    return rest["rng"]


def checkpoint_to_resume(trainer: TrainerConfig) -> Path | None:
    """The checkpoint ``trainer.resume`` asks for, or ``None`` for a fresh run."""
    if trainer.resume is None:
        return None
    if trainer.resume == "auto":
        return find_latest_checkpoint(trainer.checkpoint_dir)
    path = Path(trainer.resume)
    if not path.is_file():
        raise FileNotFoundError(f"trainer.resume={trainer.resume!r}: no such checkpoint file")
    return path


def position(batches: Iterator[Any], consumed: int, rng: dict[str, Any]) -> None:
    """Skip the ``consumed`` micro-batches of the epoch, then restore the RNG streams."""
    for _ in islice(batches, consumed):
        pass
    restore_rng_state(rng)
