"""What watches a run, as callbacks ``fit`` attaches (``kiln.core.callback_points``): step
times and padding, the compile watch, the machine sampler and the progress bar. None of
them is on the step's own path; each adds its figures to the run's telemetry at the end.
"""

from __future__ import annotations

from typing import Any

from kiln.core.callback_points import Callback
from kiln.core.config import CompileConfig
from kiln.core.module_contract import default_count_items
from kiln.core.state import Context, RunState
from kiln.core.telemetry.compile_watch import CompileWatch
from kiln.core.telemetry.flops import flops_telemetry, peak_flops_per_s
from kiln.core.telemetry.memory import device_peak_memory_mb, state_bytes
from kiln.core.telemetry.padding import padding_fraction, window_padding
from kiln.core.telemetry.progress import Progress
from kiln.core.telemetry.sampler import MachineSampler
from kiln.core.telemetry.step_timer import StepTimer


def observers(
    ctx: Context, run: RunState, compile_config: CompileConfig, compiled_blocks: int
) -> list[Callback]:
    """The observers of a run, in calling order: the step timer first (its clock starts
    after the others' ``on_window_start`` work and stops before their ``on_step_end``).
    ``compiled_blocks``: the blocks compiled in place (``compile.regional``)."""
    trainer, rank_0 = ctx.trainer, ctx.fabric.is_global_zero
    timing = StepTiming(ctx, run) if trainer.telemetry else None
    # always: it starts the run from a clean dynamo state, and costs nothing per step
    watching = CompileWatching(compile_config.recompile_warn_threshold)
    watching.watch.compiled_blocks = compiled_blocks
    watched: list[Callback] = [watching]
    if timing is not None:
        watched = [timing, watching, MemoryFigures(ctx)]
    if trainer.progress and rank_0:
        watched.append(ProgressBar(ctx, run, None if timing is None else timing.timer))
    if timing is not None and trainer.machine_sample_s is not None and rank_0:
        watched.append(MachineSampling(ctx, run, timing.timer))
    return watched


class StepTiming(Callback):
    """Each step's wall time, samples, tokens and padding (:class:`StepTimer`), and the
    throughput, padding and FLOP figures of the steps after ``trainer.warmup_steps``."""

    def __init__(self, ctx: Context, run: RunState) -> None:
        self.ctx, self.run = ctx, run
        self.timer = StepTimer(ctx.fabric.device)
        self._counts_tokens = bool(getattr(ctx.module, "items_are_tokens", False))
        # one process without count_items: the step's item count (a host integer) is the
        # window's samples
        self._items_are_samples = not ctx.has_count_hook and ctx.fabric.world_size == 1
        self._samples: Any = 0
        self._tokens: Any = None

    def on_window_start(self, window: list[Any]) -> None:
        self.timer.count_padding(window_padding(self.ctx.module, window))  # host batches
        if not self._items_are_samples:
            world = self.ctx.fabric.world_size
            self._samples = sum(default_count_items(b) for b in window) * world
        self.timer.start()

    def on_window_end(self, window: list[Any], num_items: list[Any], total: Any) -> None:
        self._tokens = total if self._counts_tokens else None
        if self._items_are_samples:
            self._samples = total

    def on_step_end(self, step: int) -> None:
        self.timer.stop(self._samples, self._tokens)

    def on_log(self, step: int, metrics: dict[str, Any]) -> None:
        self.timer.sync()  # a log step is a sync point already

    def on_fit_telemetry(self, telemetry: dict[str, Any]) -> None:
        fabric, trainer, warmup = self.ctx.fabric, self.ctx.trainer, self.ctx.trainer.warmup_steps
        timing = self.timer.summary(warmup)
        telemetry.update(timing)
        telemetry.update(padding_fraction(fabric, self.timer.measured_padding(warmup)))
        # the measured steps' own times: what a report bootstraps a speedup's interval from
        telemetry["step_times_s"] = self.timer.measured_times(warmup)
        telemetry.update(
            flops_telemetry(
                self.run.micro_batch_flops,
                trainer.accumulate_grad_batches,
                fabric.world_size,
                timing.get("step_time_median_s"),
                peak_flops_per_s(fabric.device, trainer.precision),
            )
        )


class CompileWatching(Callback):
    """torch.compile's cost and its graph breaks and recompiles (:class:`CompileWatch`),
    from a clean dynamo state; recompiles while validating are counted apart."""

    def __init__(self, threshold: int) -> None:
        self.watch = CompileWatch(threshold)
        self.watch.start()

    def on_validation_start(self) -> None:
        self.watch.validation_started()

    def on_validation_end(self) -> None:
        self.watch.validation_ended()

    def on_log(self, step: int, metrics: dict[str, Any]) -> None:
        self.watch.check()  # warns once when recompiles reach the threshold

    def on_fit_telemetry(self, telemetry: dict[str, Any]) -> None:
        telemetry.update(self.watch.snapshot())


class MemoryFigures(Callback):
    """The fit's peak memory, where it started, and this rank's state (its shard under
    FSDP): parameters, gradients and optimizer state."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def on_fit_telemetry(self, telemetry: dict[str, Any]) -> None:
        ctx = self.ctx
        telemetry["peak_memory_mb"] = device_peak_memory_mb(ctx.fabric.device)
        telemetry["start_memory_mb"] = ctx.start_memory_mb  # peak - start: the fit's own
        telemetry.update(state_bytes(ctx.module, ctx.optimizer))


class ProgressBar(Callback):
    """Rank 0's progress (:class:`Progress`): a bar in a terminal, a line per log row
    elsewhere."""

    def __init__(self, ctx: Context, run: RunState, timer: StepTimer | None) -> None:
        self.timer, self.every = timer, ctx.trainer.log_every_n_steps
        self.progress = Progress(ctx.total_steps, enabled=True, start_step=run.global_step)
        self._bar = self.progress.is_terminal

    def on_loop_start(self, fit: Any) -> None:
        self.progress.__enter__()

    def on_step_end(self, step: int) -> None:
        if self._bar:  # plain lines come with the log rows
            self.progress.update(step, None, None)

    def on_log(self, step: int, metrics: dict[str, Any]) -> None:
        loss = metrics.get("train/loss")
        speed = None if self.timer is None else self.timer.recent_samples_per_s(self.every)
        self.progress.update(step, loss, speed)

    def on_fit_end(self) -> None:
        self.progress.__exit__(None, None, None)

    def on_exception(self, error: BaseException) -> None:
        self.progress.__exit__(type(error), error, None)


class MachineSampling(Callback):
    """The machine sampled on rank 0 while the loop runs, every ``trainer.machine_sample_s``
    (:class:`MachineSampler`): each log row gets the samples since the last one (for the
    loggers, not the run's history), the telemetry the measured steps' series."""

    def __init__(self, ctx: Context, run: RunState, timer: StepTimer) -> None:
        self.ctx, self.run, self.timer = ctx, run, timer
        device = ctx.fabric.device
        gpu = (device.index or 0) if device.type == "cuda" else None
        interval = ctx.trainer.machine_sample_s
        assert interval is not None  # observers() attaches it only then
        self.sampler = MachineSampler(lambda: run.global_step, interval, gpu)

    def on_loop_start(self, fit: Any) -> None:
        self.sampler.start()

    def on_log(self, step: int, metrics: dict[str, Any]) -> None:
        metrics.update({f"machine/{k}": v for k, v in self.sampler.since_last_read().items()})

    def on_fit_end(self) -> None:
        self.sampler.stop()

    def on_exception(self, error: BaseException) -> None:
        self.sampler.stop()

    def on_fit_telemetry(self, telemetry: dict[str, Any]) -> None:
        # the timer holds this attempt's steps; its measured ones follow the warm-up
        warmup = self.ctx.trainer.warmup_steps
        first = warmup if len(self.timer) > warmup else 0
        telemetry["machine_series"] = self.sampler.series(
            self.run.global_step - len(self.timer) + first
        )
