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

``fit`` reads as its stages: ``setup`` (``loop/setup.py``), ``resume``
(``loop/resume.py``), then a loop of ``train_step`` (``loop/step.py``) and
``LogValidateCheckpoint.after_step`` (``loop/log_validate_checkpoint.py``: each on its
period), then ``finish`` (below).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from itertools import islice
from typing import Any

import lightning as L
import torch

from kiln.core.callbacks.handle import FitHandle
from kiln.core.callbacks.profiler import StepProfiler
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
from kiln.core.loop.compile import compile_scope
from kiln.core.loop.data import epoch_batches
from kiln.core.loop.first_step import LATER_STEPS, FirstStep, StepExtras
from kiln.core.loop.log_validate_checkpoint import LogValidateCheckpoint
from kiln.core.loop.resume import resume
from kiln.core.loop.setup import setup
from kiln.core.loop.step import train_step
from kiln.core.state import Context, FitResult, RunState
from kiln.core.telemetry.flops import flops_telemetry, peak_flops_per_s
from kiln.core.telemetry.memory import device_peak_memory_mb, state_bytes
from kiln.core.telemetry.padding import padding_fraction, window_padding
from kiln.core.telemetry.profile import BETWEEN_STEPS
from kiln.core.telemetry.records import Telemetry
from kiln.core.telemetry.sampler import MachineSampler

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
        callbacks: Extra objects whose ``on_*`` hooks are called with the module's.
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
        ctx = setup(module, trainer, compile_config, loggers, callbacks, plugins, run_config)
        ctx.watch.compiled_blocks, ctx.activation_checkpointing = len(blocks), checkpointed
        resume_rng = resume(ctx, run)
        periodic = LogValidateCheckpoint(ctx, run)
        windows = train_windows(ctx, run, resume_rng)
        handle = FitHandle(ctx, run, periodic.checkpoint, periodic.checkpoint_at_step_end)
        ctx.fabric.call("on_loop_start", handle)
        ctx.fabric.call("on_fit_start")
        ctx.model.train()
        poll = StopPoll(ctx.fabric)
        extras: StepExtras = FirstStep(ctx, run)  # then LATER_STEPS
        between = _between_steps(callbacks)
        with (
            _callbacks_told_of_errors(ctx.fabric),
            periodic.progress,
            listening(),
            periodic.closed_on_error(),
            _sampling(ctx, run),
        ):
            # a stop a callback or a signal requested is honoured here, at the step boundary
            while run.global_step < ctx.total_steps and run.stop_reason is None:
                with between():
                    window = next(windows)
                    ctx.timer.count_padding(window_padding(ctx.module, window))  # host batches
                out = train_step(ctx, run, window, extras)
                ctx.fabric.call("on_step_end", run.global_step)  # outside the step's timer
                extras = LATER_STEPS
                with between():
                    signum = poll() if run.global_step < ctx.total_steps else 0
                    periodic.after_step(out, interrupted=bool(signum))
                if signum:  # after the checkpoint: a resumed run must not stay stopped
                    run.stop_reason, run.stop_signal = "signal", signal.Signals(signum).name
            periodic.wait_for_checkpoints()  # the last one in place before anyone reads it
        ctx.fabric.call("on_fit_end")
        return finish(ctx, run)


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
    ctx.fabric.call("on_train_epoch_start")
    return batches


def finish(ctx: Context, run: RunState) -> FitResult:
    """Gather the run's telemetry, log it once, finalize the loggers, return the result."""
    fabric, trainer = ctx.fabric, ctx.trainer
    if run.stop_reason is None:
        at_max_steps = ctx.total_steps == trainer.max_steps
        run.stop_reason = "max_steps" if at_max_steps else "max_epochs"
    timing = ctx.timer.summary(trainer.warmup_steps)
    telemetry: Telemetry = {
        **ctx.watch.snapshot(),
        **timing,
        **padding_fraction(fabric, ctx.timer.measured_padding(trainer.warmup_steps)),
        # the measured steps' own times: what a report bootstraps a speedup's interval from
        "step_times_s": ctx.timer.measured_times(trainer.warmup_steps),
        **flops_telemetry(
            run.micro_batch_flops,
            trainer.accumulate_grad_batches,
            fabric.world_size,
            timing.get("step_time_median_s"),
            peak_flops_per_s(fabric.device, trainer.precision),
        ),
        "peak_memory_mb": device_peak_memory_mb(fabric.device),
        "start_memory_mb": ctx.start_memory_mb,  # peak - start: what the fit itself added
        # this rank's share (its shard under FSDP); gradients as the first step held them
        **state_bytes(ctx.module, ctx.optimizer),
        "grad_bytes": run.grad_bytes,
        "activation_checkpointing": ctx.activation_checkpointing,
        "skipped_steps": run.skipped_steps,
        # this attempt's whole fit: setup, compile, every step, validation, checkpoints
        "total_time_s": time.perf_counter() - run.started_at,
    }
    if run.precision_audit:
        telemetry["precision_audit"] = run.precision_audit
    if ctx.sampler is not None:
        # the timer holds this attempt's steps; its measured ones follow the warm-up
        first = trainer.warmup_steps if len(ctx.timer) > trainer.warmup_steps else 0
        telemetry["machine_series"] = ctx.sampler.series(run.global_step - len(ctx.timer) + first)
    if fabric.is_global_zero and fabric.loggers and run.stop_reason != "signal":
        fabric.log_dict(  # once, at the run's real end (not where a signal paused it)
            {f"telemetry/{k}": v for k, v in telemetry.items() if isinstance(v, int | float)},
            step=run.global_step,
        )
        for logger in fabric.loggers:
            logger.finalize("success")
    return run.result(telemetry)


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
def _sampling(ctx: Context, run: RunState) -> Generator[None, None, None]:
    """The machine sampled on rank 0 while the loop runs (``trainer.machine_sample_s``)."""
    interval = ctx.trainer.machine_sample_s
    if interval is None or not ctx.fabric.is_global_zero:
        yield
        return
    device = ctx.fabric.device
    gpu = (device.index or 0) if device.type == "cuda" else None
    ctx.sampler = MachineSampler(lambda: run.global_step, interval, gpu)
    with ctx.sampler:
        yield


def _between_steps(callbacks: Sequence[Any] | None) -> Callable[[], AbstractContextManager[Any]]:
    """What marks the loop's work outside the step timer (the next window's data, logging,
    validation, checkpoints) in a profile: a ``BETWEEN_STEPS`` range while a
    :class:`StepProfiler` is among ``callbacks``, else nothing (no cost)."""
    if any(isinstance(c, StepProfiler) for c in callbacks or ()):
        return lambda: torch.profiler.record_function(BETWEEN_STEPS)
    return nullcontext


@contextmanager
def _callbacks_told_of_errors(fabric: L.Fabric) -> Generator[None, None, None]:
    """``on_exception(error)`` on the module and callbacks when an error (Ctrl-C included)
    leaves the loop, as Lightning's Trainer does: what they started (a profiler, a thread)
    ends there instead of outliving the run."""
    try:
        yield
    except BaseException as error:
        try:
            fabric.call("on_exception", error)
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
