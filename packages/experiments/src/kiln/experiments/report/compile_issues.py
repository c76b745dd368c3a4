"""The jobs whose compiled code broke into several graphs or recompiled, and why.

kiln.core's ``CompileWatch`` records per job ``graph_breaks`` and ``recompiles`` with their
top reasons (``graph_break_reasons``: dynamo's reason and the user source line;
``recompile_reasons``: the function and the guard that failed), and of the recompiles
those while validating (``validation_recompiles``). A bench record holds them
at the top level, a training summary under ``telemetry``.
"""

from __future__ import annotations

from typing import Any

COMPILE_ISSUE_COLUMNS = [
    "model",
    "compile_mode",
    "precision",
    "graph_breaks",
    "recompiles",
    "validation_recompiles",
    "top_graph_break",
    "top_recompile",
    "graph_break_reasons",
    "recompile_reasons",
]


def compile_issue_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per job with a graph break or a recompile, most of both first.

    ``top_graph_break``/``top_recompile`` are the most frequent graph break and the first
    recompile; ``graph_break_reasons``/``recompile_reasons`` join all the job recorded.
    """
    rows = []
    for rec in records:
        figures = rec.get("telemetry") if rec.get("kind") == "train" else rec
        figures = figures or {}
        breaks, recompiles = figures.get("graph_breaks") or 0, figures.get("recompiles") or 0
        if not breaks and not recompiles:
            continue
        break_reasons = list(figures.get("graph_break_reasons") or [])
        recompile_reasons = list(figures.get("recompile_reasons") or [])
        rows.append(
            {
                "model": rec.get("model", "?"),
                "compile_mode": rec.get("compile_mode", "?"),
                "precision": rec.get("precision", "?"),
                "graph_breaks": breaks,
                "recompiles": recompiles,
                "validation_recompiles": figures.get("validation_recompiles"),
                "top_graph_break": break_reasons[0] if break_reasons else None,
                "top_recompile": recompile_reasons[0] if recompile_reasons else None,
                "graph_break_reasons": " | ".join(break_reasons) or None,
                "recompile_reasons": " | ".join(recompile_reasons) or None,
            }
        )
    return sorted(rows, key=lambda r: (-(r["graph_breaks"] + r["recompiles"]), str(r["model"])))
