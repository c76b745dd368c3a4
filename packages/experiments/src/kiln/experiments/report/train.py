"""The comparison table of a kiln-train sweep: one row per run.

Besides each run's final metrics and telemetry it derives

- ``speedup_vs_eager``: the steady step time of the run with ``compile=none`` and otherwise
  the same overrides, divided by this run's (so the eager run itself is 1.0);
- ``scaling_efficiency``: throughput per device relative to the run with the fewest devices
  and otherwise the same overrides (1.0 is perfect linear scaling). ``samples_per_s`` is
  the global throughput of a run, over all its devices.

Both are ratios of two noisy measurements, so each carries an interval (``*_ci_low``,
``*_ci_high``) and a ``*_noise`` reason. The interval is a bootstrap 95% interval of the
step-time ratio from the two runs' measured step times (telemetry ``step_times_s``,
:func:`~kiln.experiments.bench.stats.bootstrap_ratio_interval`); summaries written before
kiln kept those hold only medians and IQRs, and get the conservative ratio of the two runs'
interquartile bands (:func:`~kiln.experiments.bench.stats.band_ratio_interval`). A figure is
noise when either run measured fewer than :data:`MIN_MEASURED_STEPS` steps or the interval
spans 1.0; printed tables then show it as ``1.03 (noise: 12 steps)``, never bare.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.experiments.bench.stats import band_ratio_interval, bootstrap_ratio_interval
from kiln.experiments.console import fmt
from kiln.experiments.job import identity_overrides
from kiln.experiments.mfu import mfu_fields, mfu_text

MIN_MEASURED_STEPS = 20
"""Fewer measured (post-warm-up) steps than this in either run make a ratio noise."""
NOISE_RULE = (
    f"a speedup or scaling efficiency is marked noise when either run measured fewer than "
    f"{MIN_MEASURED_STEPS} steps or its 95% interval (bootstrap of the runs' step times; "
    f"from older summaries without them, the ratio of their bands median +- IQR/2) spans 1.0"
)
# (figure column, its interval and noise columns)
_RATIOS = {
    "speedup_vs_eager": ("speedup_ci_low", "speedup_ci_high", "speedup_noise"),
    "scaling_efficiency": ("scaling_ci_low", "scaling_ci_high", "scaling_noise"),
}

_COMPILE_KEYS = ("compile",)
_DEVICE_KEYS = ("devices", "trainer.devices", "trainer.num_nodes", "trainer.strategy")
# (the launcher is a placement key, ignored everywhere: kiln.experiments.job.PLACEMENT_KEYS)


def _config_key(record: dict[str, Any], ignore: tuple[str, ...], fields: tuple[str, ...]) -> tuple:
    """What identifies a run apart from ``ignore``d overrides (or ``fields`` without overrides)."""
    overrides = record.get("overrides")
    if overrides:
        return tuple(sorted(identity_overrides(overrides, ignore)))
    return tuple(record.get(f) for f in fields)


def run_name(record: dict[str, Any]) -> str:
    """A readable name for a run: the overrides that name its W&B run, or its job directory's
    name."""
    overrides = identity_overrides(record.get("overrides") or [])
    if overrides:
        return ",".join(overrides)
    return str(record.get("job_dir", "?")).rstrip("/").rsplit("/", 1)[-1]


def _devices(record: dict[str, Any]) -> int:
    return int(record.get("devices") or 1) * int(record.get("num_nodes") or 1)


def train_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Flat rows (metrics, telemetry, speedup against eager, scaling efficiency), one per run."""
    rows, times = [], {}
    for rec in records:
        tel = rec.get("telemetry") or {}
        row: dict[str, Any] = {
            "run": run_name(rec),
            "model": rec.get("model"),
            "precision": rec.get("precision"),
            "compile_mode": rec.get("compile_mode"),
            "devices": _devices(rec),
            "accumulate_grad_batches": rec.get("accumulate_grad_batches"),
            "status": rec.get("status"),
            "global_step": rec.get("global_step"),
            "train_loss": rec.get("train_loss"),
        }
        for name, value in sorted((rec.get("metrics") or {}).items()):
            row[name] = value
        step = tel.get("step_time_median_s")
        row.update(
            {
                "step_time_ms": step * 1e3 if isinstance(step, int | float) else None,
                "step_time_iqr_ms": tel["step_time_iqr_s"] * 1e3
                if isinstance(tel.get("step_time_iqr_s"), int | float)
                else None,
                "samples_per_s": tel.get("samples_per_s"),
                "tokens_per_s": tel.get("tokens_per_s"),
                **mfu_fields(rec),
                "compile_time_s": tel.get("compile_time_s"),
                "compile_cache": tel.get("compile_cache"),
                "peak_memory_mb": tel.get("peak_memory_mb"),
                "recompiles": tel.get("recompiles"),
                "graph_breaks": tel.get("graph_breaks"),
                "measured_steps": tel.get("measured_steps"),
                "speedup_vs_eager": None,
                "scaling_efficiency": None,
                **{col: None for cols in _RATIOS.values() for col in cols},
                "error": rec.get("error"),
            }
        )
        rows.append(row)
        times[id(row)] = tel.get("step_times_s")

    compile_keys = [
        _config_key(r, _COMPILE_KEYS, ("model", "precision", "devices", "accumulate_grad_batches"))
        for r in records
    ]
    device_keys = [
        _config_key(
            r, _DEVICE_KEYS, ("model", "precision", "compile_mode", "accumulate_grad_batches")
        )
        for r in records
    ]
    for i, row in enumerate(rows):
        eager = [
            rows[j]
            for j in range(len(rows))
            if compile_keys[j] == compile_keys[i]
            and rows[j]["compile_mode"] == "none"
            and rows[j]["step_time_ms"]
        ]
        if eager and row["step_time_ms"]:
            row["speedup_vs_eager"] = eager[0]["step_time_ms"] / row["step_time_ms"]
            if eager[0] is not row:  # the eager run against itself is 1.0 by definition
                _mark(row, "speedup_vs_eager", eager[0], row, times)
        peers = [
            rows[j]
            for j in range(len(rows))
            if device_keys[j] == device_keys[i] and rows[j]["samples_per_s"]
        ]
        if peers and row["samples_per_s"]:
            base = min(peers, key=lambda r: r["devices"])
            if row["devices"] != base["devices"] or len(peers) > 1:
                row["scaling_efficiency"] = (row["samples_per_s"] / base["samples_per_s"]) / (
                    row["devices"] / base["devices"]
                )
                if base is not row:
                    _mark(row, "scaling_efficiency", base, row, times)
    return sorted(
        rows,
        key=lambda r: (
            str(r["model"]),
            str(r["precision"]),
            str(r["compile_mode"]),
            r["devices"],
            r["run"],
        ),
    )


def _mark(
    row: dict[str, Any],
    column: str,
    base: dict[str, Any],
    run: dict[str, Any],
    times: dict[int, Any],
) -> None:
    """Set ``column``'s interval and noise reason in ``row``: ``column`` is a ratio of
    ``base``'s step time over ``run``'s (times a constant), so its interval is the figure
    scaled by the interval of that step-time ratio. ``times`` maps a row's ``id`` to its
    run's measured step times, where the summary has them."""
    low_col, high_col, noise_col = _RATIOS[column]
    steps = [r.get("measured_steps") for r in (base, run)]
    base_times, run_times = times.get(id(base)), times.get(id(run))
    medians = [(r.get("step_time_ms"), r.get("step_time_iqr_ms")) for r in (base, run)]
    if base_times and run_times:
        low, high = bootstrap_ratio_interval(base_times, run_times)
        scale = row[column] / (float(np.median(base_times)) / float(np.median(run_times)))
        row[low_col], row[high_col] = low * scale, high * scale
    elif all(isinstance(t, int | float) for pair in medians for t in pair):
        (base_ms, base_iqr), (run_ms, run_iqr) = medians
        low, high = band_ratio_interval(base_ms, base_iqr, run_ms, run_iqr)
        scale = row[column] / (base_ms / run_ms)
        row[low_col], row[high_col] = low * scale, high * scale
    if any(not isinstance(n, int) for n in steps):
        row[noise_col] = "steps not recorded"
    elif min(steps) < MIN_MEASURED_STEPS:
        row[noise_col] = f"{min(steps)} steps"
    elif row[low_col] is None:
        row[noise_col] = "no step-time spread"
    elif row[low_col] <= 1.0 <= row[high_col]:
        row[noise_col] = "interval spans 1.0"


def noise_marked(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` for printing: a speedup or scaling efficiency that is noise becomes the text
    ``"1.03 (noise: 12 steps)"``, one that is not carries its interval
    (``"2.000 [1.905, 2.105]"``) (the CSV keeps the number and the reason apart), and a
    missing MFU says why (``"n/a (cpu)"``)."""
    shown = []
    for row in rows:
        row = dict(row)
        for column, (low_col, high_col, noise_col) in _RATIOS.items():
            if row.get(column) is None:
                continue
            if row.get(noise_col):
                row[column] = f"{fmt(row[column], column)} (noise: {row[noise_col]})"
            elif row.get(low_col) is not None:
                low, high = (fmt(row[c], column) for c in (low_col, high_col))
                row[column] = f"{fmt(row[column], column)} [{low}, {high}]"
        row["mfu"] = mfu_text(row)
        shown.append(row)
    return shown


def loss_curves(records: list[dict[str, Any]], key: str = "train/loss") -> dict[str, tuple]:
    """``{run name: (steps, values)}`` of ``key`` from each run's history."""
    curves = {}
    for rec in records:
        points = [
            (h["step"], h[key])
            for h in rec.get("history") or []
            if isinstance(h.get(key), int | float) and "step" in h
        ]
        if points:
            steps, values = zip(*sorted(points), strict=True)
            curves[run_name(rec)] = (list(steps), list(values))
    return curves
