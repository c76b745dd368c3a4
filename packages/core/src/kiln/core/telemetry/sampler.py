"""The machine watched through a whole run, not only at its edges.

A neighbour's job that runs for the middle of a training run leaves no trace in samples
taken just before and just after it. :class:`MachineSampler` is a daemon thread that, every
``interval_s``, reads other processes' CPU use and the job's own
(:class:`kiln.core.telemetry.load.CpuMeter`) and, on CUDA, the device's SM clock, why it is
held below its maximum, and what other processes hold on it; each sample carries the
optimizer steps done at its start and end, so a report can name the steps a burst covered.

The series stays bounded: when it holds ``limit`` samples, neighbours are merged in pairs
(CPU averaged over their seconds, the lowest clock, the most others held) and the interval
doubles, so a long run keeps an even, coarser series instead of its first hours.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from kiln.core.telemetry.load import CpuMeter, gpu_load, nvml, tree_pids
from kiln.core.telemetry.records import MachineSample, MachineSeries

MAX_SAMPLES = 512
"""At most this many samples are kept (neighbours merge in pairs beyond it)."""


def _merge(a: MachineSample, b: MachineSample) -> MachineSample:
    seconds = a["seconds"] + b["seconds"]

    def mean(key: str) -> float:
        return (a[key] * a["seconds"] + b[key] * b["seconds"]) / seconds if seconds else 0.0  # type: ignore[literal-required]

    merged: MachineSample = {
        "t_s": a["t_s"],
        "seconds": seconds,
        "step_start": a["step_start"],
        "step_end": b["step_end"],
        "other_cpu_cores": mean("other_cpu_cores"),
        "own_cpu_cores": mean("own_cpu_cores"),
    }
    if "sm_clock_mhz" in a and "sm_clock_mhz" in b:
        merged["sm_clock_mhz"] = min(a["sm_clock_mhz"], b["sm_clock_mhz"])
        merged["throttle_reasons"] = (a.get("throttle_reasons") or 0) | (
            b.get("throttle_reasons") or 0
        )
        merged["other_gpu_memory_mb"] = max(
            a.get("other_gpu_memory_mb", 0.0), b.get("other_gpu_memory_mb", 0.0)
        )
    return merged


class MachineSampler:
    """Samples the machine every ``interval_s`` from :meth:`start` to :meth:`stop`.

    Args:
        steps_done: Returns the optimizer steps done so far (read from the thread: a plain
            attribute read, no lock or sync).
        interval_s: Seconds between samples (doubles each time the series is thinned).
        gpu_index: The CUDA device the job computes on; ``None`` reads no GPU.
        limit: At most this many samples are kept.
    """

    def __init__(
        self,
        steps_done: Callable[[], int],
        interval_s: float = 1.0,
        gpu_index: int | None = None,
        limit: int = MAX_SAMPLES,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s={interval_s!r} is not valid; it must be > 0")
        if limit < 2:
            raise ValueError(f"limit={limit!r} is not valid; it must be >= 2")
        self._steps_done, self.interval_s, self._limit = steps_done, interval_s, limit
        self._gpu_index = gpu_index
        self._samples: list[MachineSample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # the thread appends while the loop reads
        self._logged = 0  # samples already handed to :meth:`since_last_read`

    def start(self) -> MachineSampler:
        self._meter = CpuMeter()
        self._nvml = nvml() if self._gpu_index is not None else None
        self._tree = tree_pids(self._meter.root)
        self._started = time.perf_counter()
        self._step = self._steps_done()
        self._thread = threading.Thread(target=self._run, name="kiln-machine-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread, after one last sample of the time since the previous one."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self.sample()

    def __enter__(self) -> MachineSampler:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        """Read the machine since the previous sample and append it (the thread calls it)."""
        try:
            other, own, seconds = self._meter.read()
        except (psutil.Error, OSError):
            return
        step, self._step = self._step, self._steps_done()
        sample: MachineSample = {
            "t_s": round(max(time.perf_counter() - self._started - seconds, 0.0), 3),
            "seconds": round(seconds, 3),
            "step_start": step,
            "step_end": self._step,
            "other_cpu_cores": round(other, 3),
            "own_cpu_cores": round(own, 3),
        }
        if self._nvml is not None and self._gpu_index is not None:
            with contextlib.suppress(Exception):  # NVML read errors lose a GPU reading only
                gpu = gpu_load(self._nvml, self._tree)[self._gpu_index]
                sample["sm_clock_mhz"] = gpu["sm_clock_mhz"]
                sample["throttle_reasons"] = gpu.get("throttle_reasons")
                sample["other_gpu_memory_mb"] = round(gpu["other_memory_mb"], 1)
        with self._lock:
            self._samples.append(sample)
            if len(self._samples) >= self._limit:
                pairs = zip(self._samples[::2], self._samples[1::2], strict=False)
                merged = [_merge(a, b) for a, b in pairs]
                if len(self._samples) % 2:
                    merged.append(self._samples[-1])
                self._samples, self._logged = merged, len(merged)
                self.interval_s *= 2

    def since_last_read(self) -> dict[str, float]:
        """The samples since the previous call, for a history row: ``other_cpu_cores``
        and ``own_cpu_cores`` averaged over their seconds, the lowest ``sm_clock_mhz``
        (empty when no sample came since)."""
        with self._lock:
            fresh, self._logged = self._samples[self._logged :], len(self._samples)
        seconds = sum(s["seconds"] for s in fresh)
        if not fresh or seconds <= 0:
            return {}
        row = {
            key: round(sum(s[key] * s["seconds"] for s in fresh) / seconds, 3)
            for key in ("other_cpu_cores", "own_cpu_cores")
        }
        clocks = [s["sm_clock_mhz"] for s in fresh if "sm_clock_mhz" in s]
        if clocks:
            row["sm_clock_mhz"] = float(min(clocks))
        return row

    def series(self, measured_from_step: int) -> MachineSeries:
        """The samples as columns, and the steps done before the first measured one."""
        with self._lock:
            samples = list(self._samples)
        keys = [k for k in samples[0] if k != "throttle_reasons"] if samples else []
        series: MachineSeries = {
            "interval_s": self.interval_s,
            "measured_from_step": measured_from_step,
            "samples": {k: [s.get(k) for s in samples] for k in keys},  # type: ignore[misc]
        }
        if any("throttle_reasons" in s for s in samples):
            series["samples"]["throttle_reasons"] = [s.get("throttle_reasons") for s in samples]
        return series
