"""Rich tables printed at the end of a job and of a sweep."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

_TELEMETRY_UNITS = {
    "compile_time_s": "s",
    "step_time_median_s": "s",
    "step_time_iqr_s": "s",
    "samples_per_s": "/s",
    "tokens_per_s": "/s",
    "peak_memory_mb": "MB",
}


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def job_table(summary: dict[str, Any]) -> Table:
    """Final metrics and telemetry of one job."""
    status = summary["status"]
    color = "green" if status == "ok" else "red"
    table = Table(title=f"kiln-train: [{color}]{status}", title_justify="left", min_width=72)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("global_step", _fmt(summary.get("global_step")))
    table.add_row("train/loss", _fmt(summary.get("train_loss")))
    for key, value in sorted(summary.get("metrics", {}).items()):
        table.add_row(key, _fmt(value))
    for key, value in summary.get("telemetry", {}).items():
        if not isinstance(value, int | float):
            continue  # lists (graph-break reasons) are in summary.json and W&B
        unit = _TELEMETRY_UNITS.get(key, "")
        table.add_row(f"telemetry/{key}", f"{_fmt(value)} {unit}".strip(), style="dim")
    if summary.get("error"):
        table.add_row("error", summary["error"], style="red")
    if summary.get("traceback_file"):
        table.add_row("traceback", summary["traceback_file"], style="dim")
    table.caption = f"run: {summary.get('run_name')}\noutputs: {summary.get('output_dir')}"
    if summary.get("wandb"):
        table.caption += f"\nW&B run: {summary['wandb']['dir']}"
    table.caption_justify = "left"
    return table


def sweep_table(sweep_dir: str, jobs: list[tuple[str, dict[str, Any] | None]]) -> Table:
    """One row per job of a sweep: directory, overrides, status, first metric or the error."""
    table = Table(title=f"sweep {sweep_dir}", title_justify="left")
    for column in ("job dir", "overrides", "status", "result"):
        table.add_column(column)
    for job_dir, record in jobs:
        if record is None:
            table.add_row(job_dir, "?", "[red]no result file", "the job died before writing one")
            continue
        status = record.get("status", "?")
        ok = status in ("ok", "pass")
        metrics = record.get("metrics") or {}
        if record.get("error") or record.get("reason"):
            result = str(record.get("error") or record.get("reason"))
        elif metrics:
            result = ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(metrics.items())[:2])
        else:
            result = f"speedup={_fmt(record.get('speedup'))}" if "speedup" in record else ""
        table.add_row(
            job_dir,
            " ".join(record.get("overrides", [])) or "(defaults)",
            f"[{'green' if ok else 'red'}]{status}",
            result,
        )
    return table


def print_table(table: Table) -> None:
    Console(width=max(Console().width, 120)).print(table)
