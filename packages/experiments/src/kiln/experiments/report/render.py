"""Tables of a report as Markdown, CSV and a printed (rich) table, with a header on the machine."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kiln.experiments.jobs.console import fmt
from kiln.experiments.settings.job_info import JobMachine


def columns_of(rows: Sequence[dict[str, Any]], preferred: Sequence[str] | None = None) -> list[str]:
    """The preferred columns first, then any other key a row has, in first-seen order."""
    cols = list(preferred or [])
    for row in rows:
        cols += [k for k in row if k not in cols]
    return cols


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A GitHub Markdown table of ``rows``."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += [
        "| " + " | ".join(fmt(r.get(c), c).replace("|", "\\|") for c in columns) + " |"
        for r in rows
    ]
    return "\n".join(lines)


def write_csv(path: Path, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> Path:
    """Write ``rows`` to ``path`` with full-precision values (empty cell for ``None``)."""
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({c: "" if row.get(c) is None else row.get(c) for c in columns})
    return path


def machine_lines(records: Sequence[dict[str, Any]]) -> list[str]:
    """One line per distinct machine the jobs ran on (device, torch, CUDA, host)."""
    seen = []
    for rec in records:
        m: JobMachine = rec.get("machine") or JobMachine()
        line = (
            f"{m.get('device', '?')} ({m.get('device_count') or 0} GPU, "
            f"{m.get('cpu_count', '?')} CPU cores), torch {m.get('torch', '?')}, "
            f"CUDA {m.get('cuda') or '-'}, host {m.get('hostname', '?')}"
        )
        if line not in seen:
            seen.append(line)
    return seen


def print_rows(
    title: str,
    rows: Sequence[dict[str, Any]],
    columns: Sequence[str],
    width: int | None = None,
    widths: dict[str, int] | None = None,
) -> None:
    """Print ``rows`` (dicts) as a rich table titled ``title``, one column per ``columns``
    (``width``: at most that many characters a line, cells folded to fit; ``widths``: the
    width of some columns)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for column in columns:
        table.add_column(column, overflow="fold", width=(widths or {}).get(column))
    for row in rows:
        table.add_row(*(fmt(row.get(c), c) for c in columns))
    Console(width=width or max(160, sum(len(c) + 3 for c in columns))).print(table)
