"""The resume stage of ``fit``: find and load the checkpoint to continue from, and make the
checkpoint directory this run's (``rundir``). The loop then starts the epoch where the
checkpointed run stood (``data.EpochBatches`` skips the consumed micro-batches at the
sampler) and restores its random streams."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from kiln.core.checkpoint import checkpoint_candidates, load_checkpoint
from kiln.core.checkpoint_sharded import check_same_layout
from kiln.core.rundir import CheckpointDirError, DamagedCheckpointError, claim, new_run_id
from kiln.core.setup import Context
from kiln.core.sharding import is_sharded
from kiln.core.state import RunState


def resume(ctx: Context, run: RunState) -> dict[str, Any] | None:
    """Load the checkpoint ``trainer.resume`` names, if any, into ``ctx``'s objects and ``run``;
    give the run its id and claim its checkpoint directory.

    ``resume='auto'`` takes the newest intact checkpoint this directory's run wrote; a
    damaged one is skipped with a warning that names it. An explicit path that is damaged
    fails, naming it.

    Returns:
        This rank's saved RNG state, for the loop to restore once the epoch's iterator
        stands where the checkpointed run stood; ``None`` for a fresh run.
    """
    rest = _load(ctx, run)
    _claim(ctx, run, None if rest is None else rest["path"])
    return None if rest is None else rest["rng"]


def _load(ctx: Context, run: RunState) -> dict[str, Any] | None:
    trainer = ctx.trainer
    if trainer.resume is None:
        return None
    if trainer.resume == "auto":
        candidates = checkpoint_candidates(trainer.checkpoint_dir)
    else:
        path = Path(trainer.resume)
        if not path.exists():
            raise FileNotFoundError(f"trainer.resume={trainer.resume!r}: no such checkpoint file")
        candidates = [path]
    for path in candidates:
        if path.exists():  # before any object changes: DDP and FSDP state do not mix
            check_same_layout(path, is_sharded(ctx.fabric.strategy), trainer.strategy)
        try:
            rest = load_checkpoint(ctx.fabric, path, ctx.objects)
        except DamagedCheckpointError as error:
            if trainer.resume != "auto":
                raise
            warnings.warn(f"{error}; falling back to the previous checkpoint", stacklevel=2)
            continue
        _check_world_size(ctx, path, rest)
        run.load(rest)
        ctx.fabric.print(f"resumed from {path} at step {run.global_step}")
        return {**rest, "path": path}
    if candidates:  # every one was damaged: starting over would silently lose the run
        raise DamagedCheckpointError(
            f"no intact checkpoint in trainer.checkpoint_dir={trainer.checkpoint_dir!r} (damaged: "
            f"{', '.join(str(p) for p in candidates)}); resume from a copy, or start over "
            "with resume=None in a new checkpoint_dir"
        )
    return None


def _check_world_size(ctx: Context, path: Path, rest: dict[str, Any]) -> None:
    # each rank's data shard and RNG streams belong to the world size that wrote them
    saved, world = rest.get("world_size"), ctx.fabric.world_size
    if saved is not None and saved != world:
        raise ValueError(
            f"checkpoint {path} was written by a run on {saved} processes, this run has "
            f"{world}: resume it with trainer.devices x num_nodes = {saved} (a run cannot "
            "continue exactly on another world size)"
        )


def _claim(ctx: Context, run: RunState, source: Path | None) -> None:
    """Give ``run`` its id; rank 0 claims the checkpoint directory, every rank gets the id
    (a new one where ``source``, the checkpoint loaded, is another directory's)."""
    fabric, trainer = ctx.fabric, ctx.trainer
    run_id, error = None, None
    if fabric.is_global_zero:
        try:
            if trainer.checkpoint_dir is None:
                run_id = run.run_id or new_run_id()
            else:
                run_id = claim(
                    trainer.checkpoint_dir, trainer.resume, run.run_id, source, run.global_step
                )
        except Exception as raised:  # every rank must leave the collective below
            error = raised
    run_id, message = fabric.broadcast((run_id, None if error is None else str(error)))
    if error is not None:
        raise error
    if message is not None:
        raise CheckpointDirError(message)  # rank 0 raised it
    run.run_id = run_id
