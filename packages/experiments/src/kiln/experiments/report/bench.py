"""The speedup table of a kiln-bench sweep, as PyTorch's harness summarizes its runs.

Per (compile mode, precision): whether it is the control (``compile=none``, eager against
eager) and whether a control at its precision says the machine was noisy (``machine``:
``noisy machine: <model> control 1.385 outside [0.95, 1.05]``); the geometric-mean speedup
over the models that *pass*
the accuracy check, the pass rate over *all* models, how many passing models are
significantly faster or slower (their bootstrap 95% interval excludes 1.0), the mean compile
time and the geometric-mean memory ratio (compiled / eager) over the passing models.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from kiln.experiments.bench.fields import MEMORY_KEYS, SPEEDUP_KEYS
from kiln.experiments.bench.stats import geomean

MODEL_COLUMNS = [
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
        rows, key=lambda r: (str(r["compile_mode"]), str(r["precision"]), str(r["model"]))
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
    """Aggregate :func:`model_rows` per (compile mode, precision).

    ``geomean_speedup`` and ``geomean_memory_ratio`` are over passing models only (as in
    PyTorch's harness), ``pass_rate`` over all models of the group; a group where nothing
    passed has ``None`` for the means.
    """
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[(str(row["compile_mode"]), str(row["precision"]))].append(row)
    noisy = noisy_precisions(rows)
    out = []
    for (mode, precision), members in sorted(groups.items()):
        passed = [r for r in members if r["status"] == "pass"]
        compile_times = [
            r["compile_time_s"] for r in passed if isinstance(r["compile_time_s"], int | float)
        ]
        out.append(
            {
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
