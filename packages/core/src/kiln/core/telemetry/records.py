"""The records kiln.core's telemetry writes, as types: what ``fit`` returns in
``FitResult.telemetry`` and what :mod:`kiln.core.telemetry.machine` says about the machine.

They are ``TypedDict``s because they travel as JSON (a job's ``summary.json``, the W&B
summary): the keys on disk are the keys here. Each producer's part
(:class:`CompileFigures`, :class:`StepTimes`, ...) is declared once, and the records are made
of the parts. Every key is optional to the type (``total=False``): a file an older kiln wrote
may lack any of them, so read them with ``.get``; the keys' names and types are what the
types check.

Only types: importing this module imports neither torch nor Fabric.
"""

from __future__ import annotations

from typing import Any, TypedDict


class CacheFigures(TypedDict, total=False):
    """Which on-disk compile caches hit (``kiln.core.loop.compile.cache_figures``)."""

    fx_graph_cache_hits: int
    fx_graph_cache_misses: int
    aot_autograd_cache_hits: int
    aot_autograd_cache_misses: int
    compile_cache: str | None
    """``warm`` (only hits), ``cold`` (only misses), ``partial``, or ``None``: no lookups."""


class CompileCounts(TypedDict, total=False):
    """What compiling made: graphs, and where and why it broke or compiled again."""

    recompiles: int
    validation_recompiles: int
    """Of ``recompiles``, those while the loop validated (its no-grad graph: one a job)."""
    graph_breaks: int
    unique_graphs: int
    graph_break_reasons: list[str]
    graph_break_sites: list[str]
    recompile_reasons: list[str]
    compiled_blocks: int


class CompileFigures(CacheFigures, CompileCounts, total=False):
    """``CompileWatch.snapshot``: what compiling cost and where it broke."""

    compile_time_s: float


class _StepTimes(TypedDict, total=False):
    step_time_median_s: float | None
    step_time_iqr_s: float | None
    samples_per_s: float | None
    measured_steps: int


class StepTimes(_StepTimes, total=False):
    """``StepTimer.summary``: the steady steps' times (``None`` before the first step)."""

    tokens_per_s: float | None
    """Only where a measured step counted tokens: the tokens the loss counts (the module's
    ``num_items`` when ``items_are_tokens``), never padding."""


class PaddingFigures(TypedDict, total=False):
    """``padding_fraction``: only where the module counts its padding (``count_padding``)."""

    padding_fraction: float | None
    """The share of the measured steps' positions (all micro-batches, all ranks) that held
    padding."""


class FlopFigures(TypedDict, total=False):
    """``flops_telemetry``: all ranks' FLOPs per optimizer step, and their rate."""

    flops_per_step: int | None
    achieved_flops_per_s: float | None
    mfu: float | None
    """Achieved over the devices' peak; ``None`` where kiln knows no peak (the CPU)."""


class StateBytes(TypedDict, total=False):
    """``state_bytes``: this rank's parameters and optimizer state (its shard under FSDP)."""

    param_bytes: int
    optimizer_state_bytes: int


class Telemetry(CompileFigures, StepTimes, PaddingFigures, FlopFigures, StateBytes, total=False):
    """``FitResult.telemetry``: one fit's figures (and a ``summary.json``'s ``telemetry``).

    A fit fills every key but ``tokens_per_s``, ``padding_fraction`` and ``precision_audit``.
    """

    step_times_s: list[float]
    """The measured steps' own times: what a report bootstraps a ratio's interval from."""
    peak_memory_mb: float
    start_memory_mb: float | None
    """The device's memory when the fit began: ``peak - start`` is what the fit added."""
    param_bytes: int
    optimizer_state_bytes: int
    grad_bytes: int | None
    """This rank's gradients as the first step held them."""
    activation_checkpointing: str | None
    skipped_steps: int
    precision_audit: dict[str, Any]
    """With ``trainer.precision_audit``: its record."""
    total_time_s: float
    """This attempt's whole fit: setup, compile, every step, validation, checkpoints."""
    machine_series: MachineSeries
    """The machine sampled through the run (``trainer.machine_sample_s``; rank 0's)."""


class GpuInfo(TypedDict, total=False):
    """The GPUs NVML sees (empty on a CPU machine)."""

    gpu_names: list[str]
    gpu_count: int
    gpu_driver: str | None
    gpu_cuda_driver: str | None


class Machine(GpuInfo, total=False):
    """``describe_machine``: the machine's fingerprint and versions."""

    hostname: str
    cpu_model: str
    cpu_count: int | None
    affinity_cores: int
    affinity: list[int]
    threads_per_rank: int
    torch: str
    cuda: str | None
    cudnn: int | None
    python: str
    slurm_job_id: str | None
    slurm_nodelist: str | None
    slurm_nodes: list[str]


class CalibrationFigures(TypedDict):
    """One calibration's rates (``calibrate`` less its duration)."""

    device: str
    matmul_dtype: str
    matmul_size: int
    threads: int
    matmul_gflop_per_s: float
    copy_mb: int
    copy_gb_per_s: float
    chunks: int


class Calibration(CalibrationFigures):
    """``calibrate``: a fixed device benchmark's rates, and the seconds it took."""

    seconds: float


class _GpuLoad(TypedDict):
    sm_clock_mhz: int
    other_processes: int
    other_memory_mb: float


class MatmulPeak(TypedDict):
    """``measured_peak``: the machine's own matmul rate at a run's precision, at a size where
    it stops growing."""

    matmul_peak_gflop_per_s: float
    matmul_peak_size: int
    matmul_dtype: str


class CopyPeak(TypedDict):
    """``measured_bandwidth``: the machine's own memory bandwidth, a float32 copy at a size
    where the rate stops changing (out of the caches)."""

    copy_peak_gb_per_s: float
    """Bytes read plus written per second."""
    copy_peak_mb: int


class GpuLoad(_GpuLoad, total=False):
    """One GPU's clock, and the load others put on it, at one moment."""

    throttle_reasons: int | None
    """NVML's clock event reasons (a bit mask); ``None`` where the GPU does not say."""
    utilization_pct: int | None
    """The share of time a kernel ran, all processes'."""


class _LoadSample(TypedDict):
    loadavg_1m: float
    window_s: float
    other_cpu_cores: float | None
    """Cores' worth of CPU time other processes used; ``None`` where it cannot be read."""


class LoadSample(_LoadSample, total=False):
    """``load_during``: how busy other work kept the machine in a window."""

    gpus: list[GpuLoad]
    """On GPU machines only."""


class _MachineSample(TypedDict):
    t_s: float
    """When the sample's window began, in seconds since the sampler started."""
    seconds: float
    step_start: int
    """Optimizer steps done when the window began."""
    step_end: int
    """Optimizer steps done when it ended: it covered steps ``step_start + 1 .. step_end``."""
    other_cpu_cores: float
    own_cpu_cores: float
    """Cores' worth of CPU time the job's own process tree got."""


class MachineSample(_MachineSample, total=False):
    """One window of ``MachineSampler``: the load others put on the machine, and the job's
    own CPU, between two samples (with the GPU's state at its end, on CUDA)."""

    sm_clock_mhz: int
    throttle_reasons: int | None
    other_gpu_memory_mb: float


class MachineSeries(TypedDict):
    """``MachineSampler.series``: a run's samples as columns (``t_s``, ``seconds``,
    ``step_start``, ``step_end``, ``other_cpu_cores``, ``own_cpu_cores``, and on CUDA
    ``sm_clock_mhz``, ``throttle_reasons``, ``other_gpu_memory_mb``)."""

    interval_s: float
    """The cadence the last samples were taken at (it doubles each time the series thins)."""
    measured_from_step: int
    """The steps done before the first one the step-time figures measure (the warm-up's last):
    they measure steps ``measured_from_step + 1`` onward."""
    samples: dict[str, list[Any]]
