"""The speedup table of a kiln-bench sweep, as PyTorch's harness summarizes its runs.

Per (compile mode, precision): whether it is the control (``compile=none``, eager against
eager) and whether a control at its precision says the machine was noisy (``machine``:
``noisy machine: <model> control 1.385 outside [0.95, 1.05]``); the geometric-mean speedup
over the models that *pass*
the accuracy check, the pass rate over *all* models, how many passing models are
significantly faster or slower (their bootstrap 95% interval excludes 1.0), the mean compile
time and the geometric-mean memory ratio (compiled / eager) over the passing models.

Records of PyTorch's suites (``sweep=pt2_hf``/``pt2_timm``) carry their ``suite``: the
summary groups by it too, and :func:`suite_rows` pivots the summary into the seed's table
form, one row per suite and compile mode with FP32 and AMP side by side.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from kiln.experiments.bench.fields import MEMORY_KEYS, SPEEDUP_KEYS
from kiln.experiments.bench.stats import geomean

MODEL_COLUMNS = [
    "suite",
    "model",
    "compile_mode",
    "precision",
    "control",
    "status",
    *SPEEDUP_KEYS,
    "eager_ms",
    "compiled_ms",
    "compile_time_s",
    *MEMORY_KEYS,
    "graph_breaks",
    "recompiles",
    "loss_rel_err",
    "grad_rel_err",
    "reason",
]
SUMMARY_COLUMNS = [
    "suite",
    "compile_mode",
    "precision",
    "control",
    "machine",
    "models",
    "passed",
    "pass_rate",
    "geomean_speedup",
    "significant_wins",
    "significant_losses",
    "mean_compile_time_s",
    "geomean_memory_ratio",
    "graph_breaks",
    "recompiles",
]


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def model_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One flat row per benchmark job, sorted by compile mode, precision and model."""
    rows = []
    for rec in records:
        acc = rec.get("accuracy") or {}
        eager, compiled = rec.get("eager_median_s"), rec.get("compiled_median_s")
        rows.append(
            {
                "suite": rec.get("suite"),
                "model": rec.get("model", "?"),
                "compile_mode": rec.get("compile_mode", "?"),
                "precision": rec.get("precision", "?"),
                "control": rec.get("compile_mode") == "none",
                "status": rec.get("status", "error"),
                **{k: rec.get(k) for k in SPEEDUP_KEYS},
                "eager_ms": eager * 1e3 if eager is not None else None,
                "compiled_ms": compiled * 1e3 if compiled is not None else None,
                # a control compiles nothing (older records timed its first step)
                "compile_time_s": None
                if rec.get("compile_mode") == "none"
                else rec.get("compile_time_s"),
                **{k: rec.get(k) for k in MEMORY_KEYS},
                "graph_breaks": rec.get("graph_breaks"),
                "recompiles": rec.get("recompiles"),
                "loss_rel_err": acc.get("loss_rel_err"),
                "grad_rel_err": acc.get("grad_rel_err"),
                "reason": rec.get("reason"),
            }
        )
    return sorted(
        rows,
        key=lambda r: (
            str(r["suite"] or ""),
            str(r["compile_mode"]),
            str(r["precision"]),
            str(r["model"]),
        ),
    )


def noisy_precisions(rows: list[dict[str, Any]]) -> dict[str, str]:
    """``{precision: why}`` for each precision whose control (``compile=none``: eager against
    eager) read outside :data:`~kiln.experiments.bench.harness.CONTROL_BAND` or with an
    interval excluding 1.0: every (mode, precision) group at it ran on a noisy machine."""
    from kiln.experiments.bench.harness import control_noise

    noisy: dict[str, str] = {}
    for row in rows:
        why = control_noise(row) if row["control"] and row["status"] == "pass" else None
        if why is not None:
            noisy.setdefault(str(row["precision"]), f"{row['model']} {why}")
    return noisy


def summary_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Aggregate :func:`model_rows` per (suite, compile mode, precision).

    ``geomean_speedup`` and ``geomean_memory_ratio`` are over passing models only (as in
    PyTorch's harness), ``pass_rate`` over all models of the group; a group where nothing
    passed has ``None`` for the means.
    """
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        key = (str(row["suite"] or ""), str(row["compile_mode"]), str(row["precision"]))
        groups[key].append(row)
    noisy = noisy_precisions(rows)
    out = []
    for (suite, mode, precision), members in sorted(groups.items()):
        passed = [r for r in members if r["status"] == "pass"]
        compile_times = [
            r["compile_time_s"] for r in passed if isinstance(r["compile_time_s"], int | float)
        ]
        out.append(
            {
                "suite": suite or None,
                "compile_mode": mode,
                "precision": precision,
                "control": mode == "none",
                "machine": f"noisy machine: {noisy[precision]}" if precision in noisy else None,
                "models": len(members),
                "passed": len(passed),
                "pass_rate": len(passed) / len(members),
                "geomean_speedup": geomean(r["speedup"] for r in passed if _positive(r["speedup"])),
                "significant_wins": sum(1 for r in passed if r["significant"] and r["speedup"] > 1),
                "significant_losses": sum(
                    1 for r in passed if r["significant"] and r["speedup"] < 1
                ),
                "mean_compile_time_s": sum(compile_times) / len(compile_times)
                if compile_times
                else None,
                "geomean_memory_ratio": geomean(
                    r["memory_ratio"] for r in passed if _positive(r["memory_ratio"])
                ),
                "graph_breaks": sum(int(r["graph_breaks"] or 0) for r in members),
                "recompiles": sum(int(r["recompiles"] or 0) for r in members),
            }
        )
    return out


AMP_PRECISIONS = ("16-mixed", "bf16-mixed")
"""The precisions the seed's table calls AMP (fp16 AMP on a GPU; bf16 AMP on the CPU)."""
SUITE_COLUMNS = [
    "suite",
    "compile_mode",
    "models",
    "fp32_speedup",
    "fp32_pass_rate",
    "amp",
    "amp_speedup",
    "amp_pass_rate",
    "fp32_compile_time_s",
    "amp_compile_time_s",
    "fp32_memory_ratio",
    "amp_memory_ratio",
]
"""The seed's table form: per suite and compile mode, FP32 and AMP side by side."""


def suite_rows(summary: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The seed's table form of :func:`summary_rows`, for the rows that have a suite.

    One row per (suite, compile mode, AMP precision): geometric-mean speedup over passing
    models and pass rate at ``32-true`` (FP32) and at the AMP precision, mean compile time and
    geometric-mean memory ratio of each (``None`` where that precision did not run). A sweep
    that ran both ``16-mixed`` and ``bf16-mixed`` gets a row for each.
    """
    by_key = {(r["suite"], r["compile_mode"], r["precision"]): r for r in summary if r["suite"]}
    out = []
    for suite, mode in sorted({(s, m) for s, m, _ in by_key}):
        fp32 = by_key.get((suite, mode, "32-true")) or {}
        amps = [p for p in AMP_PRECISIONS if (suite, mode, p) in by_key] or [None]
        for amp_precision in amps:
            amp = by_key.get((suite, mode, amp_precision)) or {}
            out.append(
                {
                    "suite": suite,
                    "compile_mode": mode,
                    "models": max(fp32.get("models", 0), amp.get("models", 0)),
                    "fp32_speedup": fp32.get("geomean_speedup"),
                    "fp32_pass_rate": fp32.get("pass_rate"),
                    "amp": amp_precision,
                    "amp_speedup": amp.get("geomean_speedup"),
                    "amp_pass_rate": amp.get("pass_rate"),
                    "fp32_compile_time_s": fp32.get("mean_compile_time_s"),
                    "amp_compile_time_s": amp.get("mean_compile_time_s"),
                    "fp32_memory_ratio": fp32.get("geomean_memory_ratio"),
                    "amp_memory_ratio": amp.get("geomean_memory_ratio"),
                }
            )
    return out
