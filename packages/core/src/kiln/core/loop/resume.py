"""The resume stage of ``fit``: find and load the checkpoint to continue from, and make the
checkpoint directory this run's (``rundir``). The loop then starts the epoch where the
checkpointed run stood (``data.EpochBatches`` skips the consumed micro-batches at the
sampler) and restores its random streams.

A checkpoint of ``W0`` ranks resumes on ``W`` ranks when the global batch stays the same
(``trainer.accumulate_grad_batches`` is the user's to set: kiln checks it and names the value
that works). Step ``k`` then trains on the same samples, and the weights follow the
uninterrupted run up to float rounding, except for what each rank draws at random: the
saved per-rank streams (dropout, augmentation) belong to the old world, so each rank
starts a fresh one (``seed + W x step + rank``).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from kiln.core.callback_points import CallbackStates
from kiln.core.checkpoints.load import load_checkpoint
from kiln.core.checkpoints.lookup import checkpoint_candidates
from kiln.core.checkpoints.registry import StateChangedError, state_refusal, unclaimed
from kiln.core.checkpoints.rng import RngStreams
from kiln.core.checkpoints.rundir import (
    CheckpointDirError,
    DamagedCheckpointError,
    claim,
    new_run_id,
    quarantine,
)
from kiln.core.config import check_global_batch
from kiln.core.loop.data import dataset_size, epoch_batcher, epoch_samples, micro_batch_size
from kiln.core.loop.seeding import seed_rank_streams
from kiln.core.loop.stream import STATE_KEY, is_stream
from kiln.core.state import Context, RunState


class WorldRecord:
    """The world a checkpoint was written on (entry ``"world"``): its processes, global
    batch and threads; on load, what was saved waits in :attr:`saved` for the checks."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.saved: dict[str, Any] = {}

    def state_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.ctx.fabric.world_size,
            # with the world size, the global batch a resume on another world must keep
            "accumulate_grad_batches": self.ctx.trainer.accumulate_grad_batches,
            "micro_batch_size": micro_batch_size(self.ctx.train_loader),
            # a resume on another count continues, but its float sums add in another order
            "threads_per_rank": torch.get_num_threads(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.saved = dict(state)


def resume(ctx: Context, run: RunState) -> dict[str, Any] | None:
    """Load the checkpoint ``trainer.resume`` names, if any, into ``ctx``'s objects and ``run``;
    give the run its id and claim its checkpoint directory.

    ``resume='auto'`` takes the newest intact checkpoint this directory's run wrote; a
    damaged one is skipped with a warning that names it, then delisted from ``run.json`` and
    renamed ``<name>.damaged`` (it never counts toward ``keep_last_k``). An explicit path
    that is damaged fails, naming it.

    Returns:
        This rank's saved RNG state, for the loop to restore once the epoch's iterator
        stands where the checkpointed run stood; ``None`` for a fresh run.
    """
    world, rng = WorldRecord(ctx), RngStreams(ctx.fabric.global_rank, ctx.fabric.world_size)
    ctx.state.register("world", world)
    ctx.state.register("rng", rng)
    damaged: list[Path] = []
    path = _load(ctx, run, world, damaged)
    _claim(ctx, run, path, damaged)
    return None if path is None else rng.loaded


def _load(ctx: Context, run: RunState, world: WorldRecord, damaged: list[Path]) -> Path | None:
    """Load the checkpoint to resume from into every registered object; return its path
    (``damaged``: gets the newer ones ``auto`` skipped)."""
    trainer = ctx.trainer
    if trainer.resume is None:
        return None
    candidates = _candidates(trainer)
    for path in candidates:
        if STATE_KEY in ctx.state:  # a stream refuses another world, naming the checkpoint
            ctx.state[STATE_KEY].path = path
        try:
            remainder = load_checkpoint(ctx.fabric, path, ctx.state.objects())
        except DamagedCheckpointError as error:
            if trainer.resume != "auto":
                raise
            warnings.warn(f"{error}; falling back to the previous checkpoint", stacklevel=2)
            damaged.append(path)
            continue
        _check_state(ctx, run, path, remainder)
        if not is_stream(ctx.train_loader):
            _check_world_size(ctx, path, world.saved, run)
        if ctx.state["rng"].loaded is None:  # another world's: a fresh one per rank and step
            size = ctx.fabric.world_size
            seed_rank_streams(trainer.seed + size * run.global_step, ctx.fabric.global_rank)
        ctx.fabric.print(f"resumed from {path} at step {run.global_step}")
        return path
    if candidates:  # every one was damaged: starting over would silently lose the run
        raise DamagedCheckpointError(
            f"no intact checkpoint in trainer.checkpoint_dir={trainer.checkpoint_dir!r} (damaged: "
            f"{', '.join(str(p) for p in candidates)}); resume from a copy, or start over "
            "with resume=None in a new checkpoint_dir"
        )
    return None


def _check_state(ctx: Context, run: RunState, path: Path, remainder: dict[str, Any]) -> None:
    """Registered state is never dropped silently: state the checkpoint holds that no
    registered object took (a callback's, with no callback to take it), or a stateful
    callback the checkpoint holds nothing for, is refused by name unless
    ``trainer.allow_changed_state``; then the run says once what changed and keeps it in
    ``run.changed_state``.

    Raises:
        StateChangedError: They differ and ``trainer.allow_changed_state`` is false.
    """
    dropped, fresh = unclaimed(remainder), list[str]()
    if "callbacks" in ctx.state:  # the stateful callbacks: what each took and left
        callbacks: CallbackStates = ctx.state["callbacks"]
        dropped, fresh = sorted([*dropped, *callbacks.dropped]), callbacks.fresh
    if not dropped and not fresh:
        return
    if not ctx.trainer.allow_changed_state:
        raise StateChangedError(state_refusal(path, dropped, fresh))
    said = [f"dropped {', '.join(dropped)}"] if dropped else []
    said += [f"started {', '.join(fresh)} fresh"] if fresh else []
    ctx.fabric.print(
        f"resuming {path} with changed state (allow_changed_state=true): {'; '.join(said)}"
    )
    run.changed_state = [*(f"{k} dropped" for k in dropped), *(f"{k} started fresh" for k in fresh)]


def _candidates(trainer: Any) -> list[Path]:
    """The checkpoints to try, newest first: this directory's run's with ``auto``."""
    if trainer.resume == "auto":
        assert trainer.checkpoint_dir is not None  # TrainerConfig requires it with "auto"
        return checkpoint_candidates(trainer.checkpoint_dir)
    path = Path(trainer.resume)
    if not path.exists():
        raise FileNotFoundError(f"trainer.resume={trainer.resume!r}: no such checkpoint file")
    return [path]


def _check_world_size(ctx: Context, path: Path, rest: dict[str, Any], run: RunState) -> None:
    """Let a checkpoint of ``W0`` ranks continue on this run's ``W`` when the global batch
    (devices x micro-batch x accumulation) is the same: step ``k`` then trains on the same
    samples (``kiln.core.loop.data``), and only where the run stands in the epoch is converted.
    The user sets ``trainer.accumulate_grad_batches`` for the new world; another global
    batch fails, naming both world sizes and the accumulation that keeps it."""
    saved, world = rest.get("world_size"), ctx.fabric.world_size
    if saved is None or saved == world:
        return
    batch = micro_batch_size(ctx.train_loader)
    saved_accumulate, saved_batch = (
        rest.get("accumulate_grad_batches"),
        rest.get("micro_batch_size"),
    )
    where = f"checkpoint {path} was written by a run on {saved} processes, this run has {world}"
    if batch is None:
        raise ValueError(
            f"{where}: train_dataloader() uses its own batch_sampler, whose order kiln cannot "
            f"keep on another world size; resume it with trainer.devices x num_nodes = {saved}"
        )
    if saved_accumulate is None or saved_batch is None:
        raise ValueError(
            f"{where}, and it does not record its global batch (an older kiln wrote it); "
            f"resume it with trainer.devices x num_nodes = {saved}"
        )
    accumulate = ctx.trainer.accumulate_grad_batches
    check_global_batch(where, (saved, saved_batch, saved_accumulate), (world, batch, accumulate))
    # the epoch's positions trained so far, dealt to this world's ranks
    run.batch_in_epoch = run.batch_in_epoch * saved * saved_batch // (world * batch)
    _say_if_the_epoch_tails_differ(ctx, saved, saved_batch, world, batch)
    ctx.fabric.print(
        f"resuming a run of {saved} processes on {world}: accumulate_grad_batches "
        f"{saved_accumulate} -> {accumulate}, the same global batch of {world * batch * accumulate}"
    )


def _say_if_the_epoch_tails_differ(
    ctx: Context, saved: int, saved_batch: int, world: int, batch: int
) -> None:
    size = dataset_size(ctx.train_loader)
    drop_last: bool = epoch_batcher(ctx.train_loader).batches.drop_last
    if size is None:
        return
    before, now = (
        epoch_samples(size, b, w, drop_last) for b, w in ((saved_batch, saved), (batch, world))
    )
    if before != now:
        warnings.warn(
            f"on {saved} processes an epoch trained {before} positions of its order, on {world} "
            f"it trains {now} (the sampler pads each epoch to a multiple of the world size; "
            "drop_last drops a short batch per rank): every full window is the same, the "
            "last window of each epoch is not",
            stacklevel=3,
        )


def _claim(ctx: Context, run: RunState, source: Path | None, damaged: list[Path]) -> None:
    """Give ``run`` its id; rank 0 claims the checkpoint directory, every rank gets the id
    (a new one where ``source``, the checkpoint loaded, is another directory's), and takes
    the ``damaged`` checkpoints ``auto`` skipped out of the run (``rundir.quarantine``)."""
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
                for moved in quarantine(trainer.checkpoint_dir, [p.name for p in damaged]):
                    fabric.print(f"moved damaged checkpoint to {moved}: it is no longer the run's")
        except Exception as raised:  # every rank must leave the collective below
            error = raised
    run_id, message = fabric.broadcast((run_id, None if error is None else str(error)))
    if error is not None:
        raise error
    if message is not None:
        raise CheckpointDirError(message)  # rank 0 raised it
    run.run_id = run_id
