"""What machine a job ran on, how loaded it was, and how fast it computed right then.

Two runs' step times compare only when they ran on alike machines under alike load: on a
shared machine (or two SLURM nodes) the same config can run 5x slower an hour later. So a
job records

- :func:`describe_machine`: the hardware and software fingerprint (host, CPU model, the
  cores the process may use and the intra-op threads it computes with, GPUs through NVML,
  torch/CUDA/cuDNN versions, SLURM job);
- :func:`calibrate`: a fixed, sub-second device benchmark (a matmul loop at the run's
  precision, a memory copy) just before and just after training;
- :func:`load_during` that calibration (:func:`calibrate_under_load`): the load average
  and the CPU share of *other* processes while it ran (this process tree's own CPU time
  subtracted), and on GPUs the SM clock and memory other processes hold.

CPU times and processes are read through psutil (:mod:`kiln.core.telemetry.load`); NVML
(``nvidia-ml-py``) only where a GPU driver exists, so a CPU-only machine needs none.
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import psutil

from kiln.core.telemetry.load import CpuMeter, gpu_load, nvml, tree_pids

if TYPE_CHECKING:  # kiln-report reads records with FINGERPRINT_KEYS, without torch
    import torch

from kiln.core.telemetry.records import (
    Calibration,
    CalibrationFigures,
    CopyPeak,
    GpuInfo,
    LoadSample,
    Machine,
    MatmulPeak,
)

T = TypeVar("T")

CALIBRATION_BUDGET_S = 0.15
"""Seconds each of :func:`calibrate`'s two loops (matmul, copy) runs for."""

# the dtype a precision's matmuls run in (mixed precision: autocast's half type)
_CALIBRATION_DTYPES = {
    "64-true": "float64",
    "32-true": "float32",
    "32": "float32",
    "16-mixed": "float16",
    "16-true": "float16",
    "bf16-mixed": "bfloat16",
    "bf16-true": "bfloat16",
}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _affinity() -> list[int]:
    try:
        return sorted(psutil.Process().cpu_affinity() or [])
    except (AttributeError, psutil.Error):  # no affinity on this platform (macOS)
        return list(range(os.cpu_count() or 1))


def _cgroup_cpu_quota() -> int | None:
    """The CPUs a cgroup CPU quota lets this process use (rounded up), or ``None`` without one:
    cgroup v2's ``cpu.max`` in this process's group and its parents, else v1's CFS quota."""
    limits: list[int] = []
    try:
        groups = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in groups:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: a quota may sit on any ancestor
            group = Path("/sys/fs/cgroup") / path.lstrip("/")
            files = [d / "cpu.max" for d in (group, *group.parents)]
        elif "cpu" in controllers.split(","):
            base = Path("/sys/fs/cgroup") / controllers / path.lstrip("/")
            files = [base / "cpu.cfs_quota_us"]
        else:
            continue
        for file in files:
            try:
                if file.name == "cpu.max":
                    quota, period = file.read_text().split()[:2]
                else:
                    quota = file.read_text().strip()
                    period = (file.parent / "cpu.cfs_period_us").read_text().strip()
            except (OSError, ValueError):
                continue
            if quota not in ("max", "-1"):
                limits.append(max(1, -(-int(quota) // int(period))))
    return min(limits) if limits else None


def _slurm_int(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def usable_cores(ranks_on_node: int = 1) -> int:
    """The cores this process may compute on: its CPU affinity, at most a cgroup CPU quota's
    CPUs, and under SLURM at most the CPUs the job holds on this node (``SLURM_CPUS_ON_NODE``;
    ``SLURM_CPUS_PER_TASK`` x ``ranks_on_node``), which bind nothing with ``task/none``.

    Args:
        ranks_on_node: The job's processes on this node (each holds its
            ``SLURM_CPUS_PER_TASK``).
    """
    limits = [len(_affinity()), _cgroup_cpu_quota(), _slurm_int("SLURM_CPUS_ON_NODE")]
    per_task = _slurm_int("SLURM_CPUS_PER_TASK")
    if per_task is not None:
        limits.append(per_task * ranks_on_node)
    return max(1, min(n for n in limits if n is not None))


def _gpus(nvml: Any | None) -> GpuInfo:
    if nvml is None:
        return {"gpu_names": [], "gpu_count": 0, "gpu_driver": None, "gpu_cuda_driver": None}
    count = nvml.nvmlDeviceGetCount()
    names = [nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
    cuda = nvml.nvmlSystemGetCudaDriverVersion_v2()  # e.g. 12040 -> "12.4"
    return {
        "gpu_names": [n.decode() if isinstance(n, bytes) else str(n) for n in names],
        "gpu_count": count,
        "gpu_driver": str(nvml.nvmlSystemGetDriverVersion()),
        "gpu_cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}",
    }


def describe_machine() -> Machine:
    """The machine's fingerprint and versions (static for a job's lifetime).

    Returns:
        ``hostname``, ``cpu_model``, ``cpu_count``, ``affinity_cores`` (how many cores this
        process may run on) and ``affinity``, ``threads_per_rank`` (torch's intra-op threads in
        this process now: ``kiln-train`` records the count its ranks computed with,
        ``kiln.core.distributed.threads``), ``gpu_names``/``gpu_count``/``gpu_driver``/
        ``gpu_cuda_driver`` (NVML; empty on a CPU machine), ``torch``, ``cuda`` (torch's
        build), ``cudnn``, ``python``, and ``slurm_job_id``/``slurm_nodelist`` (``None``
        outside SLURM) with ``slurm_nodes``, every node of the job by name (``[]`` outside
        SLURM; ``hostname`` is the recording rank's own).
    """
    import torch

    affinity = _affinity()
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "hostname": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "affinity_cores": len(affinity),
        "affinity": affinity,
        "threads_per_rank": torch.get_num_threads(),
        **_gpus(nvml()),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "python": platform.python_version(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "slurm_nodelist": nodelist,
        "slurm_nodes": expand_hostlist(nodelist) if nodelist else [],
    }


def expand_hostlist(hostlist: str) -> list[str]:
    """The node names of a SLURM hostlist, in order, as ``scontrol show hostnames`` prints them
    (python-hostlist's parser: ``"node[0-1],gpu[08-10,12]"`` -> ``node0 node1 gpu08 gpu09
    gpu10 gpu12``).

    Raises:
        ValueError: The hostlist does not parse (an unclosed ``[``, a range that is not
            ``<int>`` or ``<int>-<int>``); the message names it.
    """
    import hostlist as python_hostlist  # pyright: ignore[reportMissingTypeStubs]

    try:
        names: list[str] = python_hostlist.expand_hostlist(hostlist)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    except python_hostlist.BadHostlist as error:  # pyright: ignore[reportUnknownMemberType]
        raise ValueError(f"SLURM hostlist {hostlist!r} does not parse: {error}") from error
    return names


FINGERPRINT_KEYS = (
    "hostname",
    "cpu_model",
    "affinity_cores",
    "threads_per_rank",
    "gpu_names",
    "gpu_driver",
    "torch",
)
"""The :func:`describe_machine` fields two runs must share for their times to compare (and,
``threads_per_rank``, for float sums to add in the same order)."""


def load_during(work: Callable[[], T]) -> tuple[T, LoadSample]:
    """``work()``'s result, and how busy the machine was with work other than this job while
    it ran.

    Returns:
        The result and the load: ``loadavg_1m`` (the kernel's, which counts this job too),
        ``other_cpu_cores``: how many cores' worth of CPU time other processes used in the
        window (all CPUs' busy time minus this process tree's), ``window_s`` (how long
        ``work`` ran), and on GPUs ``gpus``: per device its ``sm_clock_mhz``,
        ``other_processes``, ``other_memory_mb``, ``throttle_reasons`` and ``utilization_pct``
        (:func:`kiln.core.telemetry.load.gpu_load`). ``other_cpu_cores`` is ``None`` where
        psutil cannot read CPU times.
    """
    sample: LoadSample = {
        "loadavg_1m": psutil.getloadavg()[0],
        "window_s": 0.0,
        "other_cpu_cores": None,
    }
    meter: CpuMeter | None = None
    with contextlib.suppress(psutil.Error, OSError):
        meter = CpuMeter()
    start = time.perf_counter()
    result = work()
    sample["window_s"] = round(time.perf_counter() - start, 3)
    if meter is not None:
        with contextlib.suppress(psutil.Error, OSError):
            sample["other_cpu_cores"] = round(meter.read()[0], 3)
    gpus = nvml()
    if gpus is not None:
        root = meter.root if meter is not None else os.getpid()
        sample["gpus"] = gpu_load(gpus, tree_pids(root))
    return result, sample


def calibration_dtype(precision: str) -> torch.dtype:
    """The dtype a run at ``precision`` (a Fabric precision string) does its matmuls in.

    Raises:
        ValueError: ``precision`` is not one kiln knows.
    """
    if precision not in _CALIBRATION_DTYPES:
        raise ValueError(
            f"precision={precision!r} is not valid; choose one of: {', '.join(_CALIBRATION_DTYPES)}"
        )
    import torch

    return getattr(torch, _CALIBRATION_DTYPES[precision])


def _rate(work: Any, budget_s: float, sync: Any) -> tuple[float, int]:
    """Call ``work()`` for ``budget_s`` seconds (at least 3 times); calls per second over the
    whole budget (not the fastest call: a call shorter than the scheduler's time slice
    would miss the other processes that share the cores) and the calls made."""
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < budget_s or calls < 3:
        work()
        sync()
        calls += 1
    return calls / elapsed, calls


def calibrate(
    device: str | torch.device = "cpu",
    precision: str = "32-true",
    budget_s: float = CALIBRATION_BUDGET_S,
) -> Calibration:
    """A fixed device benchmark of about ``2 * budget_s`` seconds: square matmuls in the
    precision's dtype, then a float32 device-to-device copy. On the CPU it runs on
    :func:`usable_cores` threads whatever the job's ``threads_per_rank``: it measures the
    machine, and jobs of 1 and of 2 ranks per node must calibrate alike.

    Args:
        device: Where the run computes (``cpu``, ``cuda``, ``cuda:1``).
        precision: The run's Fabric precision (``32-true``, ``bf16-mixed``, ...).
        budget_s: Seconds for each of the two loops.

    Returns:
        ``matmul_gflop_per_s`` (at ``matmul_dtype``, ``matmul_size``-square matrices) and
        ``copy_gb_per_s`` (bytes read plus written per second over ``copy_mb`` MiB), with the
        ``device``, the intra-op ``threads`` and the ``seconds`` it took.
    """
    import torch

    started = time.perf_counter()
    with _on_usable_cores():
        result = _calibrate(torch.device(device), precision, budget_s)
    return {**result, "seconds": round(time.perf_counter() - started, 3)}


@contextlib.contextmanager
def _on_usable_cores() -> Generator[None]:
    """torch's intra-op threads set to :func:`usable_cores` inside, restored after: every
    measurement of this machine's limits runs on all the cores this process may use."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(usable_cores())
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _calibrate(device: torch.device, precision: str, budget_s: float) -> CalibrationFigures:
    import torch

    dtype = calibration_dtype(precision)
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    size, copy_mb = (4096, 256) if cuda else (192, 64)
    generator = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    b = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    matmuls = 4 if cuda else 2

    def matmul() -> None:
        for _ in range(matmuls):
            torch.mm(a, b)

    matmul()  # warm-up: kernels chosen, caches filled
    per_s, chunks = _rate(matmul, budget_s, sync)
    gflop = 2 * size**3 * matmuls / 1e9
    src = torch.empty(copy_mb * 2**18, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)
    copies, copy_chunks = _rate(lambda: dst.copy_(src), budget_s, sync)
    return {
        "device": str(device),
        "matmul_dtype": str(dtype).removeprefix("torch."),
        "matmul_size": size,
        "threads": torch.get_num_threads(),
        "matmul_gflop_per_s": round(gflop * per_s, 3),
        "copy_mb": copy_mb,
        "copy_gb_per_s": round(2 * copy_mb * 2**20 * copies / 1e9, 3),
        "chunks": chunks + copy_chunks,
    }


PEAK_SIZES = {"cpu": (256, 512, 1024), "cuda": (2048, 4096, 8192)}
"""The square matmul sizes :func:`measured_peak` tries, smallest first, per device type."""
PLATEAU = 1.1
"""A size that computes less than this factor faster than the one before it is the plateau."""


def measured_peak(
    device: str | torch.device = "cpu", precision: str = "32-true", budget_s: float = 0.1
) -> MatmulPeak:
    """This machine's own matmul peak at ``precision``: square matmuls of growing size
    (:data:`PEAK_SIZES`) until the rate stops growing by :data:`PLATEAU`, the best rate kept;
    on the CPU on :func:`usable_cores` threads, as :func:`calibrate`. What a run achieves over
    it says how much of what these cores (this GPU) can do the run used.

    Returns:
        ``matmul_peak_gflop_per_s``, the ``matmul_peak_size`` it was reached at, and the
        ``matmul_dtype``.
    """
    import torch

    device = torch.device(device)
    dtype = calibration_dtype(precision)
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    best, best_size = 0.0, 0
    with _on_usable_cores():
        for size in PEAK_SIZES["cuda" if cuda else "cpu"]:
            a = torch.ones(size, size, device=device, dtype=dtype)
            torch.mm(a, a)  # warm-up: kernels chosen, caches filled
            per_s, _ = _rate(lambda a=a: torch.mm(a, a), budget_s, sync)
            rate = 2 * size**3 * per_s / 1e9
            plateau = rate < PLATEAU * best
            if rate > best:
                best, best_size = rate, size
            if plateau:
                break
    return {
        "matmul_peak_gflop_per_s": round(best, 3),
        "matmul_peak_size": best_size,
        "matmul_dtype": str(dtype).removeprefix("torch."),
    }


COPY_SIZES_MB = {"cpu": (16, 64, 256), "cuda": (256, 1024, 4096)}
"""The float32 copy sizes :func:`measured_bandwidth` tries, smallest first, per device type."""


def measured_bandwidth(device: str | torch.device = "cpu", budget_s: float = 0.1) -> CopyPeak:
    """This machine's own memory bandwidth: float32 device-to-device copies of growing size
    (:data:`COPY_SIZES_MB`) until two sizes' rates agree within :data:`PLATEAU` (a copy that
    fits in a cache runs faster than memory allows), the last rate kept; on the CPU on
    :func:`usable_cores` threads, as :func:`calibrate`.

    Returns:
        ``copy_peak_gb_per_s`` (bytes read plus written per second) and the ``copy_peak_mb``
        it was measured at.
    """
    import torch

    device = torch.device(device)
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    rate, size_mb = 0.0, 0
    with _on_usable_cores():
        for size_mb in COPY_SIZES_MB["cuda" if cuda else "cpu"]:
            src = torch.ones(size_mb * 2**18, dtype=torch.float32, device=device)
            dst = torch.empty_like(src)
            dst.copy_(src)  # warm-up: pages touched
            per_s, _ = _rate(lambda s=src, d=dst: d.copy_(s), budget_s, sync)
            previous, rate = rate, 2 * size_mb * 2**20 * per_s / 1e9
            if previous and max(rate, previous) < PLATEAU * min(rate, previous):
                break
    return {"copy_peak_gb_per_s": round(rate, 3), "copy_peak_mb": size_mb}


def calibrate_under_load(
    device: str | torch.device = "cpu", precision: str = "32-true"
) -> tuple[Calibration, LoadSample]:
    """:func:`calibrate`, and the load other work put on the machine while it ran
    (:func:`load_during`): the load that could have slowed that very calibration, in one
    sub-second window instead of a calibration and a separate idle one."""
    return load_during(lambda: calibrate(device, precision))
