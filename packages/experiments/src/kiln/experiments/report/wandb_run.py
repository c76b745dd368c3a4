"""``kiln-report --wandb``: the report's tables and plots as one W&B run in the sweep's group."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.experiments.job import JobInfo
from kiln.experiments.schema import LoggerConfig
from kiln.experiments.tracking.tracker import Tracker


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


def log_report(
    root: Path,
    records: list[dict[str, Any]],
    tables: dict[str, tuple[list[str], list[dict[str, Any]]]],
    plots: list[Path],
    mode: str = "offline",
    project: str | None = None,
) -> dict[str, str] | None:
    """Log ``tables`` (name -> (columns, rows)) and ``plots`` as one ``report`` run.

    Returns:
        ``{"run_id", "dir", "mode"}`` of the run written.
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
    job = JobInfo(output_dir=str(root / "report"), job_name="report", sweep_dir=str(root))
    with Tracker(cfg, job, config={"sweep_dir": str(root)}, tags=["report"], name="report") as t:
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
