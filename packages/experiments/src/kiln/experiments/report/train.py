"""The comparison table of a kiln-train sweep: one row per run.

Besides each run's final metrics and telemetry it derives

- ``speedup_vs_eager``: the steady step time of the run with ``compile=none`` and otherwise
  the same overrides, divided by this run's (so the eager run itself is 1.0);
- ``scaling_efficiency``: throughput per device relative to the run with the fewest devices
  and otherwise the same overrides (1.0 is perfect linear scaling). ``samples_per_s`` is
  the global throughput of a run, over all its devices.
"""

from __future__ import annotations

from typing import Any

from kiln.experiments.job import identity_overrides

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
    rows = []
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
                "compile_time_s": tel.get("compile_time_s"),
                "peak_memory_mb": tel.get("peak_memory_mb"),
                "recompiles": tel.get("recompiles"),
                "graph_breaks": tel.get("graph_breaks"),
                "speedup_vs_eager": None,
                "scaling_efficiency": None,
                "error": rec.get("error"),
            }
        )
        rows.append(row)

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
