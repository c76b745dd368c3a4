"""``StepProfiler``: ``torch.profiler`` over a few optimizer steps after warm-up.

The profiler waits ``wait`` steps (compiles, caches, the first step's one-off work), warms
up ``warmup`` steps (recorded, then dropped, as the profiler's own start-up skews them) and
records ``active`` steps. A profiled step runs from one ``on_step_end`` to the next: the
previous step's logging, validation or checkpoint (when due), the next window's data, its
forwards and backwards and its optimizer step. Its boundaries lie outside the loop's step
timer, so the profiler's own start and stop (collecting and writing the trace: seconds)
never land in a timed step. It writes the Chrome /
Perfetto trace (``trace.json``; open it at ui.perfetto.dev or chrome://tracing) into
``directory`` and keeps :attr:`StepProfiler.result`: the trace's path and the
:class:`~kiln.core.telemetry.profile.StepBreakdown`. On CUDA it also records the allocator's
history over the same steps into ``memory_snapshot.pickle`` (PyTorch's memory viewer,
pytorch.org/memory_viz). Only global rank 0 profiles.

When the run fails (``on_exception``) the profiler stops there: a profile finished before
the failure stays written, one the failure cut short is discarded (no partial trace).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from kiln.core.config import ProfileConfig
from kiln.core.telemetry.profile import BETWEEN_STEPS, profiler_activities, write_profile
from kiln.core.upstream_internals import dump_memory_snapshot, record_memory_history

if TYPE_CHECKING:
    from kiln.core.callbacks.handle import FitHandle

log = logging.getLogger(__name__)


class StepProfiler:
    """Profile ``config.active`` optimizer steps after ``wait`` + ``warmup`` steps."""

    def __init__(self, config: ProfileConfig) -> None:
        self.config = config
        self.directory = Path(config.directory)
        self.result: dict[str, Any] | None = None
        self._profiler: torch.profiler.profile | None = None
        self._cuda = False
        self._steps = 0
        self._discard = False
        # the loop's work outside the steps (logging, validation, checkpoints, the next
        # window's data) as a BETWEEN_STEPS range, from a step's end to the next window
        self._between: Any = None

    @property
    def steps_needed(self) -> int:
        """Optimizer steps a run needs for a whole profile."""
        return self.config.wait + self.config.warmup + self.config.active

    def on_loop_start(self, fit: FitHandle) -> None:
        if not fit.fabric.is_global_zero:
            return
        self._cuda = fit.fabric.device.type == "cuda"
        self.directory.mkdir(parents=True, exist_ok=True)
        self._profiler = torch.profiler.profile(
            activities=profiler_activities(fit.fabric.device.type),
            schedule=torch.profiler.schedule(  # pyright: ignore[reportUnknownArgumentType, reportUnknownMemberType]
                wait=self.config.wait,
                warmup=self.config.warmup,
                active=self.config.active,
                repeat=1,
            ),
            on_trace_ready=self._ready,
            record_shapes=self.config.record_shapes,
            profile_memory=self.config.profile_memory,
            with_stack=self.config.with_stack,
        )
        self._profiler.start()

    def on_step_end(self, step: int) -> None:
        if self._profiler is None:
            return
        if self._steps == self.config.wait and self._cuda and self.config.memory_snapshot:
            record_memory_history(True)
        self._profiler.step()
        self._steps += 1
        self._between = torch.profiler.record_function(BETWEEN_STEPS)
        self._between.__enter__()

    def on_window_start(self, window: list[Any]) -> None:
        self._end_between()

    def _end_between(self) -> None:
        between, self._between = self._between, None
        if between is not None:
            between.__exit__(None, None, None)

    def on_fit_end(self) -> None:
        self._stop()

    def on_exception(self, error: BaseException) -> None:
        if self._profiler is None:
            return
        if self.result is None:
            log.warning(
                "profile: the run failed after %d steps (%s), before the profile of steps "
                "%d-%d was whole; no trace written",
                self._steps,
                type(error).__name__,
                self.config.wait + self.config.warmup + 1,
                self.config.wait + self.config.warmup + self.config.active,
            )
        self._discard = True
        self._stop()

    def _stop(self) -> None:
        self._end_between()
        profiler, self._profiler = self._profiler, None
        if profiler is not None:
            profiler.stop()
        if self._cuda and self.config.memory_snapshot and self.result is None:
            record_memory_history(False)  # the snapshot's recording ends with the profile
        if self.result is None and profiler is not None and not self._discard:
            log.warning(
                "profile: the run ended after %d steps, before the %d the profile needs "
                "(wait %d + warmup %d + active %d); no trace written",
                self._steps,
                self.steps_needed,
                self.config.wait,
                self.config.warmup,
                self.config.active,
            )

    def _ready(self, profiler: torch.profiler.profile) -> None:
        if self._discard:  # stopped by a failure mid-profile: the steps are not whole
            return
        self.result = {
            **write_profile(profiler, self.directory),
            "steps": [
                self.config.wait + self.config.warmup + 1,
                self.config.wait + self.config.warmup + self.config.active,
            ],
            "memory_snapshot": self._dump_snapshot(),
        }

    def _dump_snapshot(self) -> str | None:
        if not (self._cuda and self.config.memory_snapshot):
            return None
        path = self.directory / "memory_snapshot.pickle"
        dump_memory_snapshot(path)
        record_memory_history(False)
        return str(path)
