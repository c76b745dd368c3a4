"""What a kiln-bench measurement holds, as types: the part of ``bench.json`` that
:func:`kiln.experiments.bench.harness.run_benchmark` fills (the job adds who it is and the
machine, :mod:`kiln.experiments.settings.job_info`).

``TypedDict``s, because the record is JSON: the keys here are the keys on disk. Every key
is optional to the type (``total=False``): an error stops a benchmark part-way.
"""

from __future__ import annotations

from typing import Any, TypedDict

from kiln.core.telemetry.records import CacheFigures, CompileCounts


class SpeedupStats(TypedDict, total=False):
    """:func:`kiln.experiments.bench.stats.speedup_stats` of interleaved timings."""

    speedup: float
    """Median eager step time / median compiled."""
    speedup_ci_low: float
    speedup_ci_high: float
    """The bootstrap 95% interval of the speedup."""
    significant: bool
    """Whether the interval excludes 1.0."""
    speedup_p25: float
    speedup_p75: float
    """The 25th and 75th percentile of the per-pair ratios."""
    eager_median_s: float
    compiled_median_s: float
    eager_iqr_s: float
    compiled_iqr_s: float


class BenchResult(SpeedupStats, CacheFigures, CompileCounts, total=False):
    """:func:`~kiln.experiments.bench.harness.run_benchmark`'s result."""

    status: str
    """``pass``, ``fail`` (the accuracy check) or ``error``."""
    reason: str | None
    precision: str
    compile_mode: str
    control: bool
    """Eager against eager (``compile=none``): the machine's noise floor."""
    noisy_machine: str | None
    """In a control: why its speedup says the machine was too noisy, else ``None``."""
    backend: str
    repeats: int
    warmup: int
    method: str
    device: str
    traceback: str
    # the first steps
    first_eager_step_s: float
    compile_time_s: float | None
    cold_compile: bool
    accuracy: dict[str, Any]
    profile: dict[str, Any]
    """With ``bench.profile_steps``: ``{"eager": ..., "compiled": ...}``, each the trace's path
    and the ``breakdown`` of a step."""
    # the timed pairs: SpeedupStats, and the times
    eager_times_s: list[float]
    compiled_times_s: list[float]
    # each variant's peak memory
    memory_eager_mb: float | None
    memory_compiled_mb: float | None
    memory_ratio: float | None
    # CacheFigures and CompileCounts, and compile_time_s named for dynamo
    dynamo_compile_time_s: float | None
