"""The report's tables as printed: the columns that fit a 100-column terminal.

Every column stays in the CSVs and report.md; the terminal gets what a reader compares
first, with run labels holding only what differs between the runs.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

from kiln.experiments.jobs.console import fmt
from kiln.experiments.report.bench import SUITE_COLUMNS, SUMMARY_COLUMNS
from kiln.experiments.report.compile_issues import COMPILE_ISSUE_COLUMNS
from kiln.experiments.report.labels import differing_labels
from kiln.experiments.report.render import print_rows

WIDTH = 100
"""Printed tables fit this many columns."""
CELL_WIDTH = 10
"""Printed columns other than ``run`` are at most this wide (wider cells wrap)."""
MAX_METRICS = 2
"""At most this many final-metric columns (``val/...``) in the printed training table."""
COLUMNS = {
    "train_runs": [
        "run",
        "status",
        "*metrics",
        "step_time_ms",
        "samples_per_s",
        "compile_time_s",
        "speedup_vs_eager",
        "scaling_efficiency",
    ],
    # the seed's table without the compile times and memory ratios of AMP
    "bench_suites": [
        c for c in SUITE_COLUMNS if c not in ("amp_compile_time_s", "amp_memory_ratio")
    ],
    "compile_issues": [
        c for c in COMPILE_ISSUE_COLUMNS if c not in ("graph_break_reasons", "recompile_reasons")
    ],
    # the summary's figures; the CSV alone keeps the machine and the graph counts
    "bench_summary": [
        c for c in SUMMARY_COLUMNS if c not in ("control", "machine", "graph_breaks", "recompiles")
    ],
    "bench_models": [
        "suite",
        "model",
        "compile_mode",
        "precision",
        "status",
        "speedup",
        "compile_time_s",
        "memory_ratio",
        "reason",
    ],
}
"""The printed columns of each table (absent ones are skipped; other tables print whole)."""
HEADERS = {
    "step_time_ms": "step ms",
    "samples_per_s": "samples/s",
    "compile_time_s": "compile s",
    "mean_compile_time_s": "compile s",
    "speedup_vs_eager": "speedup vs eager",
    "scaling_efficiency": "scaling eff.",
    "geomean_speedup": "geomean speedup",
    "significant_wins": "wins",
    "significant_losses": "losses",
    "geomean_memory_ratio": "memory ratio",
    "memory_ratio": "memory ratio",
    "compile_mode": "compile",
    "pass_rate": "pass rate",
    "graph_breaks": "breaks",
    "top_graph_break": "top graph break",
    "top_recompile": "top recompile",
    "fp32_speedup": "FP32 speedup",
    "fp32_pass_rate": "FP32 pass",
    "amp_speedup": "AMP speedup",
    "amp_pass_rate": "AMP pass",
    "fp32_compile_time_s": "FP32 compile s",
    "amp_compile_time_s": "AMP compile s",
    "fp32_memory_ratio": "FP32 memory",
    "amp_memory_ratio": "AMP memory",
}
"""Shorter printed headers (the CSVs keep the column names)."""


def terminal_columns(name: str, columns: Sequence[str]) -> list[str]:
    """The columns of table ``name`` that are printed, in :data:`COLUMNS`' order."""
    if name not in COLUMNS:
        return list(columns)
    metrics = [c for c in columns if "/" in c][:MAX_METRICS]
    chosen = []
    for column in COLUMNS[name]:
        chosen += metrics if column == "*metrics" else [column] if column in columns else []
    return chosen


def print_header(lines: Sequence[str]) -> None:
    """The report's title and its ``- `` lines (sweep, machine, method), wrapped to fit."""
    for line in lines:
        if line.startswith(("#", "- ")):
            print(textwrap.fill(line, WIDTH, subsequent_indent="  "))


def print_tables(tables: dict[str, tuple[list[str], list[dict[str, Any]]]], files: str) -> None:
    """Print each table's terminal columns that hold a value, formatted as in report.md,
    ``run`` labels shortened to what differs; ``files``: where the rest is."""
    for name, (columns, rows) in tables.items():
        shown = terminal_columns(name, columns)
        shown = [c for c in shown if any(r.get(c) is not None for r in rows)]
        if "run" in shown and rows:
            labels, _ = differing_labels([str(r.get("run")) for r in rows], sep=" ")
            rows = [{**row, "run": label} for row, label in zip(rows, labels, strict=True)]
        cells = [{HEADERS.get(c, c): fmt(r.get(c), c) for c in shown} for r in rows]
        headers = [HEADERS.get(c, c) for c in shown]
        print_rows(name, cells, headers, WIDTH, _widths(cells, headers))
    print(textwrap.fill(f"all columns: {files}", WIDTH))


def _widths(cells: list[dict[str, str]], headers: list[str]) -> dict[str, int] | None:
    """Column widths that give ``run`` (the label that tells rows apart) what the other
    columns leave of :data:`WIDTH`; ``None`` (rich decides) when that is too little."""
    if "run" not in headers:
        return None
    widths = {}
    for header in headers:
        texts = [header, *(c[header] for c in cells)]
        longest_word = max(len(word) for text in texts for word in text.split() or [""])
        widths[header] = max(longest_word, min(max(map(len, texts)), CELL_WIDTH))
    others = sum(w for h, w in widths.items() if h != "run")
    left = WIDTH - others - 3 * len(headers) - 1  # "│ " and " " around each cell, "│" at the end
    if left < 10:
        return None
    widths["run"] = min(left, max(len(text) for text in ["run", *(c["run"] for c in cells)]))
    return widths
