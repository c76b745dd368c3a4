"""``kiln-report --wandb``: the report's tables and plots as one W&B run in the sweep's group.

One report run per sweep: its id is kept in ``<report dir>/report/wandb_run_id``, so a second
``kiln-report --wandb`` of the sweep continues that run (a new step of its tables and plots)
instead of adding another run named ``report``. Besides the report's own tables it logs
``comparisons``: one row per job with its ratio (speedup, scaling efficiency), the ratio's
interval and its flag (why it is not a result, or empty), the table a W&B bar chart of speedup
by compile mode is made from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.experiments.report.rows import SCALING, SPEEDUP
from kiln.experiments.settings.base import LoggerConfig
from kiln.experiments.settings.job_info import JobInfo
from kiln.experiments.tracking.tracker import Tracker

REPORT_DIR = "report"
"""The report run's directory below the report's output directory."""
COMPARISON_COLUMNS = [
    "run",
    "model",
    "compile_mode",
    "precision",
    "devices",
    "ratio",
    "value",
    "ci_low",
    "ci_high",
    "flag",
]
# (ratio name, report column, its interval columns, its noise column) per report table
_RATIOS = {
    "train_runs": [
        (name, names.value, names.low, names.high, names.noise)
        for name, names in (("speedup", SPEEDUP), ("scaling_efficiency", SCALING))
    ],
    "bench_models": [("speedup", "speedup", "speedup_ci_low", "speedup_ci_high", None)],
}


def sweep_group(records: list[dict[str, Any]], root: Path) -> tuple[str, str | None]:
    """The W&B group and project the sweep's jobs logged to (a record's ``wandb`` entry).

    Falls back to ``<job name>/<sweep dir name>``, the group kiln's jobs use by default.
    """
    for rec in records:
        info = rec.get("wandb") or {}
        if info.get("group"):
            return info["group"], info.get("project")
    job_name = next((r.get("job_name") for r in records if r.get("job_name")), "report")
    return f"{job_name}/{root.resolve().name}", None


def _flag(row: dict[str, Any], noise_column: str | None) -> str:
    """Why a row's ratio is not a result: ``confounded: ...``, its noise reason, ``reference``
    (a training sweep's eager run), a failed accuracy check or run; empty when it is one."""
    confounded = row.get("confounded")
    if confounded:
        return confounded if isinstance(confounded, str) else "confounded"
    if noise_column and row.get(noise_column):
        return f"noise: {row[noise_column]}"
    if noise_column == SPEEDUP.noise and row.get("compile_mode") == "none":
        return "reference"  # the eager run: 1.0 by definition
    status = row.get("status")
    if status not in (None, "ok", "pass"):
        return str(status)
    if row.get("significant") is False:
        return "not significant"
    return ""


def comparison_rows(tables: dict[str, tuple[list[str], list[dict[str, Any]]]]) -> list[dict]:
    """One row per job and ratio of the report's ``train_runs`` and ``bench_models`` tables
    (:data:`COMPARISON_COLUMNS`); a job without the ratio (no eager partner, one device
    count) has no row for it."""
    rows = []
    for table, ratios in _RATIOS.items():
        for row in tables.get(table, ([], []))[1]:
            for name, column, low, high, noise in ratios:
                if row.get(column) is None:
                    continue
                rows.append(
                    {
                        "run": row.get("run") or row.get("model"),
                        **{k: row.get(k) for k in ("model", "compile_mode", "precision")},
                        "devices": row.get("devices"),
                        "ratio": name,
                        "value": row[column],
                        "ci_low": row.get(low),
                        "ci_high": row.get(high),
                        "flag": _flag(row, noise),
                    }
                )
    return rows


def log_report(
    root: Path,
    records: list[dict[str, Any]],
    tables: dict[str, tuple[list[str], list[dict[str, Any]]]],
    plots: list[Path],
    mode: str = "offline",
    project: str | None = None,
) -> dict[str, str] | None:
    """Log ``tables`` (name -> (columns, rows)), the ``comparisons`` table and ``plots`` to
    the sweep's ``report`` run (the one an earlier call made, if any).

    Returns:
        ``{"run_id", "dir", "mode", "project", "group"}`` of the run written.
    """
    import wandb

    group, job_project = sweep_group(records, root)
    cfg = LoggerConfig(
        backend="wandb",
        mode=mode,
        project=project or job_project or "kiln",
        group=group,
        job_type="report",
    )
    job = JobInfo(output_dir=str(root / REPORT_DIR), job_name="report", sweep_dir=str(root))
    tables = {**tables, "comparisons": (COMPARISON_COLUMNS, comparison_rows(tables))}
    with Tracker(
        cfg, job, config={"sweep_dir": str(root)}, tags=["report"], name="report", resume=True
    ) as t:
        payload: dict[str, Any] = {}
        for name, (columns, rows) in tables.items():
            payload[name] = wandb.Table(
                columns=list(columns), data=[[_cell(r.get(c)) for c in columns] for r in rows]
            )
        for plot in plots:
            payload[plot.stem] = wandb.Image(str(plot))
        t.run.log(payload)
        return t.info


def _cell(value: Any) -> Any:
    return value if isinstance(value, int | float | str | bool) or value is None else str(value)
