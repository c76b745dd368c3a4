"""The figures a bench record holds, named once: the job's W&B summary and the report's
per-model columns both list them from here."""

from __future__ import annotations

SPEEDUP_KEYS = (
    "speedup",
    "speedup_p25",
    "speedup_p75",
    "speedup_ci_low",
    "speedup_ci_high",
    "significant",
)
"""The speedup figures of :func:`kiln.experiments.bench.stats.speedup_stats`."""
MEMORY_KEYS = ("memory_eager_mb", "memory_compiled_mb", "memory_ratio")
"""Each variant's peak memory (:mod:`kiln.experiments.bench.step_memory`) and their ratio."""
SUMMARY_KEYS = (
    "status",
    "reason",
    "control",
    "noisy_machine",
    *SPEEDUP_KEYS,
    "eager_median_s",
    "compiled_median_s",
    "compile_time_s",
    "dynamo_compile_time_s",
    *MEMORY_KEYS,
    "graph_breaks",
    "recompiles",
    "accuracy",
)
"""What a benchmark's W&B summary holds (under ``bench/``)."""
