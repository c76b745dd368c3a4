"""kiln's training loop: a plain Fabric loop over a LightningModule (no Trainer).

    fabric = L.Fabric(precision=..., devices=..., strategy=...)
    model = fabric.setup_module(torch.compile(module))        # compile before setup
    for window in windows_of(train_loader, accumulate_grad_batches):  # on the host
        total = all_reduce(sum(count_items(b) for b in window))  # items in the window, all ranks
        for batch in window:                                    # no DDP sync but on the last
            out = model.training_step(fabric.to_device(batch), i)  # one at a time
            fabric.backward(out["loss"] * out["num_items"] * world_size / total)
        clip; optimizer.step(); scheduler.step(); zero_grad; global_step += 1

The update of a window therefore equals the update of one batch holding all of its items.

Where things are: ``setup`` (``loop/setup.py``) builds Fabric, the loaders, the model and
the optimizer and registers what checkpoints hold (``checkpoints/registry.py``); ``resume``
(``loop/resume.py``) loads a checkpoint into the registry; :func:`train` below is the loop:
``train_step`` (``loop/step.py``, the whole step), then ``LogValidateCheckpoint.after_step``
(``loop/log_validate_checkpoint.py``, each on its period); ``finish`` gathers the
telemetry. What watches the run is callbacks at named points (``callback_points.py``).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Generator, Iterator, Sequence
from contextlib import contextmanager
from itertools import islice
from typing import Any, cast

import lightning as L
import torch

from kiln.core.callback_points import CallbackList
from kiln.core.callbacks.handle import FitHandle
from kiln.core.checkpoints.registry import Record
from kiln.core.checkpoints.rng import restore_rng_state
from kiln.core.config import CompileConfig, TrainerConfig
from kiln.core.distributed.stop import StopPoll, listening
from kiln.core.distributed.threads import apply_threads_per_rank
from kiln.core.errors import (
    EmptyEpochError,
    EmptyWindowError,
    NonFiniteGradientError,
    NonFiniteLossError,
)
from kiln.core.loop.activation_checkpointing import activation_checkpointing
from kiln.core.loop.compile import OwnGradsUnderCudaGraphs, compile_scope
from kiln.core.loop.data import epoch_batches
from kiln.core.loop.first_step import FirstStep
from kiln.core.loop.log_validate_checkpoint import LogValidateCheckpoint
from kiln.core.loop.observers import observers
from kiln.core.loop.resume import resume
from kiln.core.loop.setup import setup
from kiln.core.loop.step import train_step
from kiln.core.state import Context, FitResult, RunState
from kiln.core.telemetry.records import Telemetry

log = logging.getLogger(__name__)

# the exceptions and the result are importable beside fit, the function that raises them
__all__ = ["EmptyWindowError", "FitResult", "NonFiniteGradientError", "NonFiniteLossError", "fit"]


def fit(
    module: L.LightningModule,
    trainer: TrainerConfig,
    compile_config: CompileConfig | None = None,
    *,
    loggers: Sequence[Any] | None = None,
    callbacks: Sequence[Any] | None = None,
    plugins: Sequence[Any] | None = None,
    run_config: dict[str, Any] | None = None,
) -> FitResult:
    """Train ``module`` (see ``kiln.core.module_contract``) as ``trainer`` and
    ``compile_config`` say.

    Args:
        module: A LightningModule following kiln's module contract.
        trainer: What the loop does (steps, accumulation, precision, devices, checkpoints).
        compile_config: How ``torch.compile`` is applied; ``None`` trains eagerly.
        loggers: Fabric loggers (``fabric.log_dict`` goes to each; only rank 0 writes).
        callbacks: Objects whose ``on_*`` points are called (``kiln.core.callback_points``).
        plugins: Extra Fabric plugins; a precision plugin replaces ``trainer.precision``.
        run_config: The run's configuration, stored in every checkpoint.

    Returns:
        The final step, validation metrics, telemetry and logged history.

    Raises:
        NonFiniteLossError: The loss (or, with clipping, the gradient norm:
            ``NonFiniteGradientError``) became NaN or infinite; the message names the step.
        EmptyWindowError: A window counted zero items over all ranks.

    Any exception raised out of ``fit`` after training started carries the run's progress
    as ``error.kiln_result``: a :class:`FitResult` whose ``global_step`` is the optimizer
    steps taken and whose ``history`` holds the rows logged before the failure.
    """
    apply_threads_per_rank(trainer)  # before any op: float sums add in its order
    run = RunState()
    compile_config = compile_config or CompileConfig()
    with (
        _deterministic_algorithms(trainer.deterministic),
        _result_on_error(run),
        _prepared(module, trainer, compile_config) as (checkpointed, blocks),
    ):
        ctx = setup(module, trainer, compile_config, loggers, callbacks, plugins)
        ctx.activation_checkpointing = checkpointed
        ctx.state.register("loop", run)  # the loop's counters, histories and metrics
        ctx.state.register("config", Record(run_config))
        resume_rng = resume(ctx, run)
        poll = StopPoll(ctx.fabric, ctx.total_steps)  # the last callback: decides the stop
        ctx.callbacks = CallbackList(
            [
                module,
                FirstStep(ctx, run),
                *observers(ctx, run, compile_config, len(blocks)),
                *([OwnGradsUnderCudaGraphs(ctx.module)] if ctx.cuda_graphs else []),
                *(callbacks or []),
                poll,
            ]
        )
        periodic = LogValidateCheckpoint(ctx, run)
        windows = train_windows(ctx, run, resume_rng)
        handle = FitHandle(ctx, run, periodic.checkpoint, periodic.checkpoint_at_step_end)
        with _callbacks_told_of_errors(ctx.callbacks), listening(), periodic.closed_on_error():
            ctx.callbacks("on_loop_start", handle)
            ctx.callbacks("on_fit_start")
            train(ctx, run, windows, periodic, poll)
        ctx.callbacks("on_fit_end")
        return finish(ctx, run)


def train(
    ctx: Context,
    run: RunState,
    windows: Iterator[list[Any]],
    periodic: LogValidateCheckpoint,
    poll: StopPoll,
) -> None:
    """The loop: a step, its callbacks, then logging, validation and checkpoints on their
    periods, until ``max_steps`` (or the epochs) or a stop."""
    ctx.model.train()
    # a stop a callback or a signal requested is honoured here, at the step boundary
    while run.global_step < ctx.total_steps and run.stop_reason is None:
        out = train_step(ctx, run, next(windows))
        ctx.callbacks("on_step_end", run.global_step)  # the stop poll answers last
        periodic.after_step(out, interrupted=lambda: bool(poll.signum))
        if poll.signum:  # after the checkpoint: a resumed run must not stay stopped
            run.stop_reason, run.stop_signal = "signal", signal.Signals(poll.signum).name
    periodic.wait_for_checkpoints()  # the last one in place before anyone reads it


def train_windows(
    ctx: Context, run: RunState, resume_rng: dict[str, Any] | None
) -> Iterator[list[Any]]:
    """Windows of micro-batches, epoch after epoch, from where ``run`` stands.

    Each epoch starts lazily, when its first window is asked for (after the previous
    epoch's last step is done). A resumed run's first epoch starts where the checkpointed
    run stood (the consumed micro-batches are skipped at the sampler, never loaded), and
    then its random streams come back.
    """
    batches = _start_epoch(ctx, run)
    if resume_rng is not None:
        restore_rng_state(resume_rng)
    accumulate = ctx.trainer.accumulate_grad_batches
    while True:
        # pre-fetch a window at a time, on the host; the epoch's last window may be shorter
        window = list(islice(batches, accumulate))
        if not window:  # restarting this epoch would yield nothing again, forever
            raise EmptyEpochError(
                f"epoch {run.epoch} yields no micro-batch from where the run stands (batch "
                f"{run.batch_in_epoch} of an epoch of {ctx.batches_per_epoch}): the data or "
                "batch size differs from the run the checkpoint was saved by; resume with "
                "the checkpoint's data and batch size, or start over in a new checkpoint_dir"
            )
        while window:
            yield window
            window = list(islice(batches, accumulate))
        batches = _start_epoch(ctx, run)


def _start_epoch(ctx: Context, run: RunState) -> Iterator[Any]:
    # batch_in_epoch is 0 at an epoch's start, except in the epoch a run resumes in
    batches = epoch_batches(
        ctx.fabric, ctx.train_loader, ctx.trainer.seed, run.epoch, skip=run.batch_in_epoch
    )
    ctx.callbacks("on_train_epoch_start")
    return batches


def finish(ctx: Context, run: RunState) -> FitResult:
    """Gather the run's telemetry (each observer adds its own), log it once, finalize the
    loggers, return the result."""
    fabric = ctx.fabric
    if run.stop_reason is None:
        at_max_steps = ctx.total_steps == ctx.trainer.max_steps
        run.stop_reason = "max_steps" if at_max_steps else "max_epochs"
    telemetry: dict[str, Any] = {
        "activation_checkpointing": ctx.activation_checkpointing,
        "skipped_steps": run.skipped_steps,
        "grad_bytes": run.grad_bytes,  # this rank's, as the first step held them
    }
    if run.precision_audit:
        telemetry["precision_audit"] = run.precision_audit
    ctx.callbacks("on_fit_telemetry", telemetry)
    # this attempt's whole fit: setup, compile, every step, validation, checkpoints
    telemetry["total_time_s"] = time.perf_counter() - run.started_at
    if fabric.is_global_zero and fabric.loggers and run.stop_reason != "signal":
        fabric.log_dict(  # once, at the run's real end (not where a signal paused it)
            {f"telemetry/{k}": v for k, v in telemetry.items() if isinstance(v, int | float)},
            step=run.global_step,
        )
        for logger in fabric.loggers:
            logger.finalize("success")
    return run.result(cast(Telemetry, telemetry))


@contextmanager
def _prepared(
    module: L.LightningModule, trainer: TrainerConfig, compile_config: CompileConfig
) -> Generator[tuple[str | None, list[Any]], None, None]:
    """The module as it trains, for the fit: torchtitan's order, activation checkpointing
    then compile (sharding follows, in ``setup``). Yields how it was checkpointed and the
    blocks compiled in place."""
    with (
        activation_checkpointing(module, trainer.activation_checkpointing) as checkpointed,
        compile_scope(module, compile_config) as blocks,
    ):
        yield checkpointed, blocks


@contextmanager
def _callbacks_told_of_errors(callbacks: CallbackList) -> Generator[None, None, None]:
    """``on_exception(error)`` on the module and callbacks when an error (Ctrl-C included)
    leaves the loop, as Lightning's Trainer does: what they started (a profiler, a thread)
    ends there instead of outliving the run."""
    try:
        yield
    except BaseException as error:
        try:
            callbacks("on_exception", error)
        except Exception:  # the run's own error is the news, not a callback's about it
            log.exception("a callback's on_exception failed")
        raise


@contextmanager
def _deterministic_algorithms(enabled: bool) -> Generator[None, None, None]:
    # A global switch: restored afterwards, so one job of a sweep cannot leak it to the next.
    was_enabled = torch.are_deterministic_algorithms_enabled()
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it
        torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was_enabled)


@contextmanager
def _result_on_error(run: RunState) -> Generator[None, None, None]:
    """Attach the run's progress to any exception leaving ``fit`` (``error.kiln_result``)."""
    try:
        yield
    except BaseException as error:
        # what callers report for a failed job: the steps done and what was logged
        error.kiln_result = run.result()  # type: ignore[attr-defined]
        raise
