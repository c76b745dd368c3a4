"""Hyperparameter studies (``hparams_search=``): the trials ranked by the optimized metric.

A study is a kiln-train sweep run by the Optuna sweeper; its ``multirun.yaml`` names the
searched parameters (``hydra.sweeper.params``) and each job's config its
``optimized_metric`` (name and mode).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from kiln.experiments.settings.dotted import select


def study_params(root: Path, records: list[dict[str, Any]]) -> list[str]:
    """The parameters an Optuna study in ``root`` searched; ``[]`` when it is no study.

    Read from the sweep's ``multirun.yaml`` or, as the Optuna sweeper writes none, from a
    job's ``.hydra/hydra.yaml``.
    """
    return list(_search_space(root, records))


def log_params(root: Path, records: list[dict[str, Any]]) -> set[str]:
    """The parameters the study searched on a log scale (``tag(log, interval(...))``): their
    plots get a log axis."""
    return {p for p, spec in _search_space(root, records).items() if "log" in str(spec)}


def _search_space(root: Path, records: list[dict[str, Any]]) -> dict[str, Any]:
    """The Optuna sweeper's ``params`` (name -> search spec), ``{}`` when it is no study."""
    candidates = [root / "multirun.yaml"] + [
        Path(str(r["job_dir"])) / ".hydra" / "hydra.yaml" for r in records if r.get("job_dir")
    ]
    found = next((path for path in candidates if path.is_file()), None)
    if found is None:
        return {}
    config = OmegaConf.to_container(OmegaConf.load(found), resolve=False)
    sweeper = (config.get("hydra") or {}).get("sweeper")  # type: ignore[union-attr]
    if not sweeper or "optuna" not in str(sweeper.get("_target_", "")).lower():
        return {}
    return dict(sweeper.get("params") or {})


def study_rows(records: list[dict[str, Any]], params: list[str]) -> tuple[str, list[dict]]:
    """The trials best first (failed and non-finite ones last), with their parameters.

    Returns:
        The metric's name and one row per trial: ``rank``, ``run``, each parameter, the
        metric, ``status``.
    """
    metric = next(
        (
            r["config"]["optimized_metric"]
            for r in records
            if (r.get("config") or {}).get("optimized_metric")
        ),
        {"name": "", "mode": "min"},
    )
    name = metric.get("name") or next(
        (next(iter(r["metrics"]), "") for r in records if r.get("metrics")), ""
    )
    sign = 1.0 if metric.get("mode", "min") == "min" else -1.0
    rows = []
    for record in records:
        value = (record.get("metrics") or {}).get(name)
        finite = record.get("status") == "ok" and value is not None and math.isfinite(value)
        row = {"run": Path(str(record.get("job_dir", "?"))).name}
        row |= {p: select(record.get("config") or {}, p) for p in params}
        row |= {name: value, "status": record.get("status")}
        rows.append((0 if finite else 1, sign * value if finite else 0.0, row))
    ranked = [row for *_, row in sorted(rows, key=lambda t: (t[0], t[1]))]
    for rank, row in enumerate(ranked, 1):
        row["rank"] = rank
    return name, ranked


def study_plots(
    rows: list[dict[str, Any]], params: list[str], metric: str, on_log: set[str]
) -> list[dict[str, Any]]:
    """The arguments of each parameter's scatter plot (``report.plots.scatter_figure``): the
    finished trials' points, the best trial's (``rows`` are ranked: the first, if it
    finished), a log x axis for a parameter searched on a log scale."""
    specs = []
    for param in params:
        points = [
            (float(r[param]), float(r[metric]))
            for r in rows
            if r["status"] == "ok" and isinstance(r[param], int | float) and r[metric] is not None
        ]
        if points:
            best = points[0] if rows[0]["status"] == "ok" else None
            specs.append(
                {
                    "points": points,
                    "title": f"{metric} vs {param}",
                    "xlabel": param,
                    "ylabel": metric,
                    "log_x": param in on_log,
                    "best": best,
                }
            )
    return specs
