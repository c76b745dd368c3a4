"""Steady-state step time and throughput of a run.

:class:`StepTimer` times every optimizer step without a host sync (CUDA events on the GPU)
and reads the times at the loop's sync points; its summary drops the warm-up steps
(compilation, allocator and cache warm-up) and reports medians, not means, because the
machines are shared and noisy. Peak memory and per-rank state bytes live in
:mod:`kiln.core.telemetry.memory`, compilation in :mod:`kiln.core.telemetry.compile_watch`.
"""

from __future__ import annotations

import math
import time
from typing import Any, cast

import numpy as np
import torch

from kiln.core.telemetry.records import StepTimes

Padding = tuple[int, int]
"""(padding positions, all positions) of a step's micro-batches."""

MAX_STEP_TIMES = 1000
"""At most this many step times go into a run's telemetry (``step_times_s``)."""


class StepTimer:
    """Wall time, samples and tokens of every optimizer step.

    The loop calls :meth:`start` and :meth:`stop` around each step. Neither synchronizes
    the host with the device: on CUDA each is an event recorded on the current stream (the
    gap between two events includes launch bubbles), elsewhere a ``perf_counter`` reading.
    Stopped steps wait until :meth:`sync`, which the loop calls at its own sync points (log
    steps), to be read and recorded. :meth:`summary` turns the steps after warm-up into the
    run's step-time figures, and :meth:`recent_samples_per_s` gives the current throughput
    in constant time.

    Args:
        device: The device the steps run on; CUDA devices are timed with events.
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        self._cuda = device is not None and torch.device(device).type == "cuda"
        self._started: float | torch.cuda.Event | None = None
        # stopped steps not read yet: (seconds or a (start, end) event pair, samples, tokens,
        # padding)
        self._stopped: list[tuple[Any, int, int | torch.Tensor | None, Padding | None]] = []
        self._padding_next: Padding | None = None
        self._seconds: list[float] = []
        self._samples: list[int] = []
        self._tokens: list[float] = []  # NaN where a step's tokens were not counted
        self._padding: list[Padding | None] = []
        # running totals make recent throughput O(1) however long the run
        self._cum_seconds: list[float] = [0.0]
        self._cum_samples: list[int] = [0]

    def start(self) -> None:
        """Start timing a step."""
        if self._cuda:
            self._started = torch.cuda.Event(enable_timing=True)
            self._started.record()
        else:
            self._started = time.perf_counter()

    def count_padding(self, padding: Padding | None) -> None:
        """The padding of the step about to run: (padding positions, all positions) of this
        rank's micro-batches, or ``None`` if not counted. :meth:`stop` records it."""
        self._padding_next = padding

    def stop(self, samples: int, tokens: int | torch.Tensor | None = None) -> None:
        """Stop timing the step :meth:`start` began; it is recorded at the next :meth:`sync`.

        Args:
            samples: Samples it trained on (all micro-batches, all ranks).
            tokens: Tokens it trained on (a device tensor is read at :meth:`sync`), or
                ``None`` if not counted for this step.
        """
        started, self._started = self._started, None
        if started is None:
            raise RuntimeError("StepTimer.stop called without a StepTimer.start before it")
        padding, self._padding_next = self._padding_next, None
        if isinstance(started, float):
            self._stopped.append((time.perf_counter() - started, samples, tokens, padding))
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._stopped.append(((started, end), samples, tokens, padding))

    def sync(self) -> None:
        """Read the stopped steps' times and token counts and record them (a host sync)."""
        stopped, self._stopped = self._stopped, []
        counts = [t for _, _, t, _ in stopped if isinstance(t, torch.Tensor)]
        # one device-to-host copy for all tensor token counts (tolist() is typed a bare list)
        host = cast(list[float], torch.stack(counts).tolist()) if counts else []  # pyright: ignore[reportUnknownMemberType]
        read = iter(host)
        for timing, samples, tokens, padding in stopped:
            if not isinstance(timing, float):
                start, end = timing
                end.synchronize()
                timing = start.elapsed_time(end) / 1000.0  # milliseconds
            count = next(read) if isinstance(tokens, torch.Tensor) else tokens
            self.record(timing, samples, None if count is None else int(count), padding)

    def __len__(self) -> int:
        return len(self._seconds)

    def record(
        self,
        seconds: float,
        samples: int,
        tokens: int | None = None,
        padding: Padding | None = None,
    ) -> None:
        """Add one optimizer step.

        Args:
            seconds: Its wall time.
            samples: Samples it trained on (all micro-batches, all ranks).
            tokens: Tokens it trained on, or ``None`` if not counted for this step.
            padding: (padding positions, all positions) of this rank's micro-batches, or
                ``None`` if not counted for this step.
        """
        if seconds < 0:
            raise ValueError(f"seconds={seconds} is not valid; a step time must be >= 0")
        self._seconds.append(float(seconds))
        self._samples.append(int(samples))
        self._tokens.append(math.nan if tokens is None else float(tokens))
        self._padding.append(padding)
        self._cum_seconds.append(self._cum_seconds[-1] + float(seconds))
        self._cum_samples.append(self._cum_samples[-1] + int(samples))

    def recent_samples_per_s(self, steps: int) -> float | None:
        """Throughput over the last ``steps`` recorded steps (fewer if not recorded yet)."""
        if steps < 1:
            raise ValueError(f"steps={steps} is not valid; it must be >= 1")
        first = max(len(self._seconds) - steps, 0)
        seconds = self._cum_seconds[-1] - self._cum_seconds[first]
        samples = self._cum_samples[-1] - self._cum_samples[first]
        return samples / seconds if seconds > 0 else None

    def summary(self, warmup_steps: int) -> StepTimes:
        """Step-time figures over the steps after the first ``warmup_steps``.

        When the run has no more steps than the warm-up, all steps are used (so short runs
        still report something); ``measured_steps`` says how many went in.

        Returns:
            ``step_time_median_s``, ``step_time_iqr_s`` (75th minus 25th percentile),
            ``samples_per_s`` and, if any measured step counted tokens, ``tokens_per_s``
            (throughputs are totals over total time), plus ``measured_steps``. The figures
            are ``None`` before the first step.
        """
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps={warmup_steps} is not valid; it must be >= 0")
        self.sync()
        first = warmup_steps if len(self._seconds) > warmup_steps else 0
        if first >= len(self._seconds):
            return {
                "step_time_median_s": None,
                "step_time_iqr_s": None,
                "samples_per_s": None,
                "measured_steps": 0,
            }
        seconds = np.asarray(self._seconds[first:])
        q25, median, q75 = np.percentile(seconds, [25, 50, 75])
        total = self._cum_seconds[-1] - self._cum_seconds[first]
        samples = self._cum_samples[-1] - self._cum_samples[first]
        result: StepTimes = {
            "step_time_median_s": float(median),
            "step_time_iqr_s": float(q75 - q25),
            "samples_per_s": samples / total if total > 0 else None,
            "measured_steps": len(seconds),
        }
        # tokens may be counted only on some steps (each count is a host sync)
        tokens = np.asarray(self._tokens[first:])
        counted = ~np.isnan(tokens)
        if counted.any():
            token_time = float(seconds[counted].sum())
            result["tokens_per_s"] = (
                float(tokens[counted].sum()) / token_time if token_time > 0 else None
            )
        return result

    def measured_padding(self, warmup_steps: int) -> Padding | None:
        """(padding positions, all positions) summed over the steps :meth:`summary` measures
        that counted them, on this rank; ``None`` if none did."""
        self.sync()
        first = warmup_steps if len(self._seconds) > warmup_steps else 0
        counted = [p for p in self._padding[first:] if p is not None]
        if not counted:
            return None
        return sum(p for p, _ in counted), sum(n for _, n in counted)

    def measured_times(self, warmup_steps: int, limit: int = MAX_STEP_TIMES) -> list[float]:
        """The step times :meth:`summary` measures (after warm-up), for a bootstrap interval.

        Args:
            warmup_steps: As in :meth:`summary`.
            limit: At most this many: a longer run's times are thinned evenly (every k-th
                step), which keeps their spread and bounds the size of a run's summary.
        """
        self.sync()
        first = warmup_steps if len(self._seconds) > warmup_steps else 0
        times = self._seconds[first:]
        stride = math.ceil(len(times) / limit) if len(times) > limit else 1
        return times[::stride]
