"""Rich tables printed at the end of a job and of a sweep, and the one cell formatter that
every printed or written table (job, sweep, report) uses."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kiln.experiments.jobs.mfu import measured_peak_text, mfu_fields, mfu_text
from kiln.experiments.jobs.train_record import TrainRecord
from kiln.experiments.settings.job_info import RECORD_KINDS, STOPPED

if TYPE_CHECKING:
    from kiln.experiments.jobs.sweep_scan import SweepJob

_TELEMETRY_UNITS = {
    "compile_time_s": "s",
    "step_time_median_s": "s",
    "step_time_iqr_s": "s",
    "samples_per_s": "/s",
    "tokens_per_s": "/s",
    "peak_memory_mb": "MB",
}
# shown in their own rows (units, MFU "n/a (cpu)"), not as raw telemetry
_OWN_ROWS = ("flops_per_step", "achieved_flops_per_s", "mfu", "of_measured_peak", "compile_cache")


def fmt(value: Any, column: str = "") -> str:
    """A table cell: floats rounded by what they are (``column`` says), ``None`` as a dash."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if column == "flops_per_step" and isinstance(value, int | float):
        return f"{value:.3g}"  # 12 digits say less than the exponent
    if isinstance(value, float):
        if column.endswith("rel_err"):
            return f"{value:.1e}"
        if column.endswith("pass_rate"):
            return f"{value:.0%}"
        if "speedup" in column or "ratio" in column or "efficiency" in column:
            return f"{value:.3f}"
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value).replace("\n", " ")


def _flop_rows(table: Table, rec: TrainRecord) -> None:
    """FLOPs per step, achieved TFLOP/s, MFU and the share of the measured peak."""
    flops = mfu_fields(rec)
    table.add_row("FLOPs/step", fmt(flops["flops_per_step"], "flops_per_step"))
    table.add_row("achieved TFLOP/s", fmt(flops["achieved_tflops_per_s"]))
    table.add_row("MFU", mfu_text(flops))
    if flops["of_measured_peak"] is not None:  # on any device, the CPU too
        table.add_row("of measured peak", measured_peak_text(rec, flops["of_measured_peak"]))


def job_table(summary: dict[str, Any] | TrainRecord) -> Table:
    """Final metrics and telemetry of one job (its ``summary.json`` record)."""
    rec = summary if isinstance(summary, TrainRecord) else TrainRecord.from_json(summary)
    color = {"ok": "green", STOPPED: "yellow"}.get(rec.status, "red")
    table = Table(title=f"kiln-train: [{color}]{rec.status}", title_justify="left", min_width=72)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("global_step", fmt(rec.global_step))
    if rec.stop_reason:
        stopped = f"signal {rec.stop_signal}" if rec.stop_signal else rec.stop_reason
        table.add_row("stopped by", stopped)
    table.add_row("train/loss", fmt(rec.train_loss))
    for key, value in sorted(rec.metrics.items()):
        table.add_row(key, fmt(value))
    telemetry = rec.telemetry or {}
    if telemetry:
        _flop_rows(table, rec)
        if cache := telemetry.get("compile_cache"):
            table.add_row("compile cache", cache)
    for key, value in telemetry.items():
        if key in _OWN_ROWS or not isinstance(value, int | float):
            continue  # lists (graph-break reasons) are in summary.json and W&B
        unit = _TELEMETRY_UNITS.get(key, "")
        table.add_row(f"telemetry/{key}", f"{fmt(value)} {unit}".strip(), style="dim")
    if rec.error:
        # escaped: an error is no markup ("[/__w/.../pair.cc:561] Connection closed by peer")
        table.add_row("error", escape(rec.error), style="red")
    if rec.traceback_file:
        # relative to the job directory (error.log), or a refused attempt's temporary file
        where = Path(rec.output_dir or ".") / rec.traceback_file
        table.add_row("traceback", str(where), style="dim")
    table.caption = f"run: {rec.run_name}\noutputs: {rec.output_dir}"
    if rec.wandb:
        table.caption += f"\nW&B run: {rec.wandb['dir']}"
    table.caption_justify = "left"
    return table


def sweep_table(sweep_dir: str, jobs: list[SweepJob]) -> Table:
    """One row per job of a sweep: directory, overrides, status, first metric or the error."""
    table = Table(title=f"sweep {sweep_dir}", title_justify="left")
    for column in ("job dir", "overrides", "status", "result"):
        table.add_column(column)
    for job in jobs:
        job_dir, record = job.name, job.record
        if record is None:
            if job.unreadable:
                table.add_row(job_dir, "?", "[red]unreadable result file", job.unreadable)
            else:
                table.add_row(
                    job_dir, "?", "[red]no result file", "the job died before writing one"
                )
            continue
        status = record.get("status", "?")
        ok = status in ("ok", "pass")
        metrics = record.get("metrics") or {}
        reason = next(
            (record[k.reason_key] for k in RECORD_KINDS if record.get(k.reason_key)), None
        )
        if reason:
            result = escape(str(reason))
        elif metrics:
            result = ", ".join(f"{k}={fmt(v)}" for k, v in sorted(metrics.items())[:2])
        else:
            result = f"speedup={fmt(record.get('speedup'))}" if "speedup" in record else ""
        table.add_row(
            job_dir,
            " ".join(record.get("overrides", [])) or "(defaults)",
            f"[{'green' if ok else 'red'}]{status}",
            result,
        )
    return table


def show_table(table: Table) -> None:
    """Print a built rich ``table`` at least 120 columns wide (tables wrap badly below)."""
    Console(width=max(Console().width, 120)).print(table)
