"""Other work's load on the machine, read through psutil (CPU) and NVML (GPUs).

:class:`CpuMeter` reads, between two calls, how many cores' worth of CPU time the whole
machine spent busy, how much of it this job's process tree spent, and the difference: the
cores other processes took. :func:`gpu_load` reads each GPU's SM clock, why it is held
below its maximum, and what other processes hold on it. Both the edge samples
(:func:`kiln.core.telemetry.machine.load_during`) and the sampler that watches a whole run
(:mod:`kiln.core.telemetry.sampler`) read through them.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psutil

from kiln.core.telemetry.records import GpuLoad


def job_root_pid() -> int:
    """The process whose tree is this job: a worker spawned by a torch elastic agent
    (``kiln.core.distributed.launch``) belongs to its agent's tree, with its sibling ranks;
    any other process is its own root."""
    if os.environ.get("TORCHELASTIC_RUN_ID") and os.getppid() > 1:
        return os.getppid()
    return os.getpid()


def _busy_s() -> float:
    """All CPUs' non-idle seconds since boot (everything but idle and iowait)."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def _tree(root: int) -> list[psutil.Process]:
    try:
        process = psutil.Process(root)
        return [process, *process.children(recursive=True)]
    except psutil.Error:  # the root ended
        return []


def _cpu_s(process: psutil.Process) -> float | None:
    try:
        times = process.cpu_times()
    except psutil.Error:  # it ended while we looked
        return None
    # children_*: the descendants it waited for, which left the tree with their CPU time
    return times.user + times.system + times.children_user + times.children_system


class CpuMeter:
    """Cores' worth of CPU time used between two :meth:`read` calls, by other processes
    (all CPUs' busy time minus this job's tree's) and by the job itself.

    Args:
        root: The job's root process (its descendants are the job too); the default is
            :func:`job_root_pid`.
    """

    def __init__(self, root: int | None = None) -> None:
        self.root = job_root_pid() if root is None else root
        self._last: tuple[float, float, dict[int, float]] = self._now()

    def _now(self) -> tuple[float, float, dict[int, float]]:
        own = {p.pid: s for p in _tree(self.root) if (s := _cpu_s(p)) is not None}
        return time.perf_counter(), _busy_s(), own

    def read(self) -> tuple[float, float, float]:
        """``(other_cores, own_cores, seconds)`` since the previous call (or creation)."""
        (start, busy, own), now = self._last, self._now()
        self._last = now
        seconds = now[0] - start
        # a process new to the tree counts from zero; one that left keeps its last reading
        own_s = sum(s - own.get(pid, 0.0) for pid, s in now[2].items())
        if seconds <= 0:
            return 0.0, 0.0, 0.0
        own_cores = max(own_s, 0.0) / seconds
        return max(now[1] - busy - own_s, 0.0) / seconds, own_cores, seconds


def nvml() -> Any | None:
    """The initialized ``pynvml`` module, or ``None`` without the package or a GPU driver."""
    try:
        import pynvml  # pyright: ignore[reportMissingTypeStubs]  # nvidia-ml-py has no types

        pynvml.nvmlInit()
    except Exception:  # no nvidia-ml-py, no libnvidia-ml, no driver: a CPU machine
        return None
    return pynvml


def _throttle_reasons(nvml: Any, handle: Any) -> int | None:
    # the newer name first (NVML 12.5 renamed it), then the older one
    for name in (
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    ):
        if hasattr(nvml, name):
            try:
                return int(getattr(nvml, name)(handle))
            except Exception:  # not supported on this GPU
                return None
    return None


def gpu_load(nvml: Any, tree: set[int]) -> list[GpuLoad]:
    """Per GPU: ``sm_clock_mhz``, ``other_processes`` and ``other_memory_mb`` (processes
    outside ``tree``), ``throttle_reasons`` (NVML's bit mask; 0 or the idle bit alone: not
    held back; ``None`` where unsupported) and ``utilization_pct`` (all processes')."""
    gpus: list[GpuLoad] = []
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        others = [
            p
            for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            if p.pid not in tree and p.usedGpuMemory is not None
        ]
        try:
            utilization: int | None = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except Exception:  # not supported on this GPU
            utilization = None
        gpus.append(
            {
                "sm_clock_mhz": nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
                "other_processes": len(others),
                "other_memory_mb": sum(p.usedGpuMemory for p in others) / 2**20,
                "throttle_reasons": _throttle_reasons(nvml, handle),
                "utilization_pct": utilization,
            }
        )
    return gpus


def tree_pids(root: int) -> set[int]:
    """``root`` and its descendants' process ids."""
    return {p.pid for p in _tree(root)} or {root}
