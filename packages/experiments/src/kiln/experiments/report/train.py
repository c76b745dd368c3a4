"""The comparison table of a kiln-train sweep: one row per run.

Besides each run's final metrics and telemetry it derives

- ``speedup_vs_eager``: the steady step time of the run with ``compile=none`` and otherwise
  the same resolved config, divided by this run's (so the eager run itself is 1.0);
- ``scaling_efficiency``: throughput per device relative to the run with the fewest devices
  and otherwise the same resolved config (1.0 is perfect linear scaling). ``samples_per_s``
  is the global throughput of a run, over all its devices.
- against the run with ``trainer.strategy=ddp`` (``auto`` on several devices) and no
  activation checkpointing, otherwise the same resolved config (``sweep=strategy``):
  ``speedup_vs_ddp`` (its step time / this run's: the throughput ratio, the global batch
  being the same), ``memory_vs_ddp`` (what the fit added to memory, peak minus start, over
  the base run's) and ``state_vs_ddp`` (per-rank parameter + gradient + optimizer-state
  bytes over the base run's: exact counts, about 1/R under FSDP on R ranks).
- ``tokens_vs_unpacked``: ``tokens_per_s`` (the tokens the loss counts, never padding) over
  that of the run with ``data.packing=false`` and otherwise the same resolved config
  (``-m data.packing=false,true``); ``padding_fraction`` says how much of each run's
  measured rows was padding.

Each ratio also gets a ``*_verdict``: ``confounded: <reason>`` when the two runs' machines,
calibrations or loads differ (:mod:`kiln.experiments.report.comparable`), ``unverified: no
machine record`` for older summaries, ``unpaired: <why>`` when a run has no partner.

Both are ratios of two noisy measurements, so each carries an interval (``*_ci_low``,
``*_ci_high``) and a ``*_noise`` reason. The interval is a bootstrap 95% interval of the
step-time ratio from the two runs' measured step times (telemetry ``step_times_s``,
resampled in moving blocks: :func:`~kiln.experiments.bench.stats.block_ratio_interval`);
summaries written before kiln kept those hold only medians and IQRs, and get the
conservative ratio of the two runs' interquartile bands
(:func:`~kiln.experiments.bench.stats.band_ratio_interval`). A figure is noise when either
run measured fewer than :data:`MIN_MEASURED_STEPS` steps or the interval spans 1.0; printed
tables then show it as ``1.03 (noise: 12 steps)``, never bare.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.core.telemetry.records import Telemetry
from kiln.experiments.bench.stats import (
    band_ratio_interval,
    block_ratio_interval,
    bootstrap_runs_ratio_interval,
)
from kiln.experiments.jobs.console import fmt
from kiln.experiments.jobs.mfu import mfu_fields, mfu_text
from kiln.experiments.jobs.train_record import TrainRecord
from kiln.experiments.report.comparable import TRUST_RULE, impossible, verdict
from kiln.experiments.report.pairing import computed_config, pair_key, why_unpaired
from kiln.experiments.report.rows import RATIOS, SCALING, SPEEDUP, STRATEGY, Ratio, RatioColumns
from kiln.experiments.settings.job_info import identity_overrides

MIN_MEASURED_STEPS = 20
"""Fewer measured (post-warm-up) steps than this in either run make a ratio noise."""
NOISE_RULE = (
    f"a speedup or scaling efficiency is marked noise when either run measured fewer than "
    f"{MIN_MEASURED_STEPS} steps or its 95% interval spans 1.0; the interval is a moving-block "
    f"bootstrap of the runs' step times (within runs, in blocks of about sqrt(n) steps), and "
    f"over the repeats too where a configuration "
    f"ran more than once (`repeat=range(N)`: across repeats and within runs); from older "
    f"summaries without step times, the ratio of their bands median +- IQR/2; runs are paired "
    f"by their resolved configs; {TRUST_RULE}"
)
_COMPILE_KEYS = ("compile",)
_DEVICE_KEYS = ("devices", "trainer.devices", "trainer.num_nodes", "trainer.strategy")
_STRATEGY_KEYS = ("trainer.strategy", "trainer.activation_checkpointing", "trainer.fsdp")
_PACKING_KEYS = ("data.packing", "data.packing_policy")
# what identifies a run in a record with neither a resolved config nor overrides
_FIELDS = ("model", "precision", "compile_mode", "devices", "accumulate_grad_batches")
_COMPILE_FIELDS = tuple(f for f in _FIELDS if f != "compile_mode")
_DEVICE_FIELDS = tuple(f for f in _FIELDS if f != "devices")
_STRATEGY_FIELDS = _FIELDS
# (the launcher is a placement key, ignored everywhere:
# kiln.experiments.settings.job_info.PLACEMENT_KEYS)


def run_name(record: dict[str, Any]) -> str:
    """A readable name for a run: the overrides that name its W&B run, or its job directory's
    name."""
    overrides = identity_overrides(record.get("overrides") or [])
    if overrides:
        return ",".join(overrides)
    return str(record.get("job_dir", "?")).rstrip("/").rsplit("/", 1)[-1]


def _devices(record: dict[str, Any]) -> int:
    """The job's processes over all its nodes (the record's ``devices`` counts every node)."""
    return int(record.get("devices") or 1)


def _strategy(record: dict[str, Any]) -> str | None:
    """``ddp``, ``fsdp`` or ``single``: what ``trainer.strategy`` came to (``auto``: DDP on
    several devices)."""
    strategy = record.get("strategy")
    if strategy in (None, "auto"):
        return ("ddp" if _devices(record) > 1 else "single") if strategy else None
    return str(strategy)


def _state_mb(tel: Telemetry) -> float | None:
    parts = [tel.get(k) for k in ("param_bytes", "grad_bytes", "optimizer_state_bytes")]
    if not all(isinstance(p, int | float) for p in parts):
        return None
    return sum(parts) / 2**20


def _memory_rise_mb(tel: Telemetry) -> float | None:
    peak, start = tel.get("peak_memory_mb"), tel.get("start_memory_mb")
    if not isinstance(peak, int | float):
        return None
    return peak - start if isinstance(start, int | float) else peak


def _row(record: dict[str, Any]) -> dict[str, Any]:
    rec = TrainRecord.from_json(record)
    tel = rec.telemetry or {}
    row: dict[str, Any] = {
        "run": run_name(record),
        "model": rec.model,
        "precision": rec.precision,
        "compile_mode": rec.compile_mode,
        "devices": _devices(record),
        "accumulate_grad_batches": rec.accumulate_grad_batches,
        "strategy": _strategy(record),
        "activation_checkpointing": rec.activation_checkpointing,
        "status": rec.status,
        "global_step": rec.global_step,
        "train_loss": rec.train_loss,
    }
    for name, value in sorted((rec.metrics or {}).items()):
        row[name] = value
    step, iqr = tel.get("step_time_median_s"), tel.get("step_time_iqr_s")
    row.update(
        {
            "step_time_ms": step * 1e3 if isinstance(step, int | float) else None,
            "step_time_iqr_ms": iqr * 1e3 if isinstance(iqr, int | float) else None,
            "samples_per_s": tel.get("samples_per_s"),
            "tokens_per_s": tel.get("tokens_per_s"),
            "padding_fraction": tel.get("padding_fraction"),
            "tokens_vs_unpacked": None,
            **mfu_fields(rec),
            "compile_time_s": tel.get("compile_time_s"),
            "compile_cache": tel.get("compile_cache"),
            "peak_memory_mb": tel.get("peak_memory_mb"),
            "memory_rise_mb": _memory_rise_mb(tel),
            "state_mb": _state_mb(tel),
            "recompiles": tel.get("recompiles"),
            "graph_breaks": tel.get("graph_breaks"),
            "measured_steps": tel.get("measured_steps"),
            **{col: None for names in RATIOS for col in names.all},
            "memory_vs_ddp": None,
            "state_vs_ddp": None,
            "error": rec.error,
        }
    )
    return row


def train_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Flat rows (metrics, telemetry, speedup against eager, scaling efficiency), one per run.

    Runs pair by resolved config (:mod:`kiln.experiments.report.pairing`): a compiled run's
    eager partner differs from it only in ``compile``, a scaling peer only in the device
    count; repeats of one configuration (``repeat=``) are pooled on each side."""
    runs = [(rec, _row(rec)) for rec in records]
    same = [pair_key(rec, (), _FIELDS) for rec in records]  # repeats share it
    by_compile = [pair_key(rec, _COMPILE_KEYS, _COMPILE_FIELDS) for rec in records]
    by_devices = [pair_key(rec, _DEVICE_KEYS, _DEVICE_FIELDS) for rec in records]
    _against_ddp(runs, [pair_key(rec, _STRATEGY_KEYS, _STRATEGY_FIELDS) for rec in records], same)
    _against_unpacked(runs, [pair_key(rec, _PACKING_KEYS, _FIELDS) for rec in records], same)
    for i, (rec, row) in enumerate(runs):
        own = [
            runs[j] for j in range(len(runs)) if same[j] == same[i] and runs[j][1]["step_time_ms"]
        ]
        eager = [
            runs[j]
            for j in range(len(runs))
            if by_compile[j] == by_compile[i]
            and runs[j][1]["compile_mode"] == "none"
            and runs[j][1]["step_time_ms"]
        ]
        if row["compile_mode"] == "none" and row["step_time_ms"]:
            row["speedup_vs_eager"] = 1.0  # the eager run against itself, by definition
        elif eager and row["step_time_ms"]:
            figure = _median([r["step_time_ms"] for _, r in eager]) / _median(
                [r["step_time_ms"] for _, r in own]
            )
            _ratio(row, SPEEDUP, eager, own, figure)
        elif row["compile_mode"] not in (None, "none"):
            candidates = [r for r, other in runs if other["compile_mode"] == "none"]
            row[SPEEDUP.verdict] = why_unpaired(rec, candidates, _COMPILE_KEYS, "compile=none run")
        peers = [
            runs[j]
            for j in range(len(runs))
            if by_devices[j] == by_devices[i] and runs[j][1]["samples_per_s"]
        ]
        if peers and row["samples_per_s"]:
            fewest = min(p[1]["devices"] for p in peers)
            base = [p for p in peers if p[1]["devices"] == fewest]
            mine = [p for p in peers if p[1]["devices"] == row["devices"]]
            if row["devices"] == fewest and len(peers) > len(base):
                row["scaling_efficiency"] = 1.0  # the base of the comparison
            elif row["devices"] != fewest:
                figure = (
                    _median([r["samples_per_s"] for _, r in mine])
                    / _median([r["samples_per_s"] for _, r in base])
                    * fewest
                    / row["devices"]
                )
                _ratio(row, SCALING, base, mine, figure)
        elif any(other["devices"] != row["devices"] for _, other in runs):
            candidates = [r for r, other in runs if other["devices"] != row["devices"]]
            what = "run on another device count"
            row[SCALING.verdict] = why_unpaired(rec, candidates, _DEVICE_KEYS, what)
    return sorted(
        (row for _, row in runs),
        key=lambda r: (
            str(r["model"]),
            str(r["precision"]),
            str(r["compile_mode"]),
            r["devices"],
            r["run"],
        ),
    )


def _is_ddp_base(row: dict[str, Any]) -> bool:
    return row["strategy"] == "ddp" and not row["activation_checkpointing"]


def _against_ddp(
    runs: list[tuple[dict[str, Any], dict[str, Any]]], keys: list[tuple], same: list[tuple]
) -> None:
    """``speedup_vs_ddp``, ``memory_vs_ddp`` and ``state_vs_ddp`` of every run that has a
    DDP run without activation checkpointing and otherwise the same config (the base: 1.0)."""
    for i, (_, row) in enumerate(runs):
        group = [runs[j] for j in range(len(runs)) if keys[j] == keys[i]]
        base = [r for r in group if _is_ddp_base(r[1])]
        if not base or len(group) == len(base):  # nothing to compare with
            continue
        own = [runs[j] for j in range(len(runs)) if same[j] == same[i]]
        for column, field in (("memory_vs_ddp", "memory_rise_mb"), ("state_vs_ddp", "state_mb")):
            mine, theirs = [r[field] for _, r in own], [r[field] for _, r in base]
            if all(isinstance(v, int | float) and v > 0 for v in mine + theirs):
                row[column] = _median(mine) / _median(theirs)
        if _is_ddp_base(row) and row["step_time_ms"]:
            row["speedup_vs_ddp"] = 1.0  # the base against itself, by definition
        elif row["step_time_ms"] and all(r["step_time_ms"] for _, r in base):
            figure = _median([r["step_time_ms"] for _, r in base]) / _median(
                [r["step_time_ms"] for _, r in own]
            )
            _ratio(row, STRATEGY, base, own, figure)


def _packed(record: dict[str, Any]) -> bool:
    """Whether the run packed its rows (``data.packing``: resolved config, else overrides)."""
    flat = computed_config(record)
    if flat is not None:
        return bool(flat.get("data.packing"))
    return "data.packing=true" in [str(o).lower() for o in record.get("overrides") or []]


def _against_unpacked(
    runs: list[tuple[dict[str, Any], dict[str, Any]]], keys: list[tuple], same: list[tuple]
) -> None:
    """``tokens_vs_unpacked`` of every run that has a ``data.packing=false`` run with the same
    config otherwise (the base: 1.0); repeats are pooled by their median."""
    for i, (_, row) in enumerate(runs):
        group = [runs[j] for j in range(len(runs)) if keys[j] == keys[i]]
        base = [r["tokens_per_s"] for rec, r in group if not _packed(rec)]
        own = [runs[j][1]["tokens_per_s"] for j in range(len(runs)) if same[j] == same[i]]
        if not base or len(base) == len(group) or not row["tokens_per_s"]:
            continue  # no unpacked run, nothing packed, or no tokens counted
        if all(isinstance(v, int | float) and v > 0 for v in base + own):
            row["tokens_vs_unpacked"] = _median(own) / _median(base)


def _median(values: list[float]) -> float:
    return float(np.median(values))


def _ratio(
    row: dict[str, Any],
    names: RatioColumns,
    base: list[tuple[dict[str, Any], dict[str, Any]]],
    runs: list[tuple[dict[str, Any], dict[str, Any]]],
    figure: float,
) -> None:
    """Set ``row``'s ratio ``names`` to ``figure``, a ratio of the ``base`` runs over ``runs``
    (each a list of (record, row): one run, or the repeats of one configuration) that moves
    with their step-time ratio, with its interval (the step-time ratio's, scaled), noise
    reason, verdict (are the runs comparable) and which bootstrap it took."""
    row.update(_measured_ratio(names.value, base, runs, figure).columns(names))


def _measured_ratio(
    column: str,
    base: list[tuple[dict[str, Any], dict[str, Any]]],
    runs: list[tuple[dict[str, Any], dict[str, Any]]],
    figure: float,
) -> Ratio:
    ratio = Ratio(value=figure)
    rows = [[r for _, r in side] for side in (base, runs)]
    times = [[_telemetry(rec).get("step_times_s") for rec, _ in side] for side in (base, runs)]
    repeated = len(base) > 1 or len(runs) > 1
    if all(t for side in times for t in side):
        if repeated:
            low, high = bootstrap_runs_ratio_interval(times[0], times[1])
            ratio.bootstrap = f"across {len(base)} and {len(runs)} repeats and within runs"
        else:
            (num,), (den,) = times  # both present: checked above
            low, high = block_ratio_interval(num or [], den or [])
            ratio.bootstrap = "within runs"
        point = _median([_median(t) for t in times[0]]) / _median([_median(t) for t in times[1]])
        ratio.low, ratio.high = low * figure / point, high * figure / point
    elif not repeated and all(
        isinstance(r.get(k), int | float)
        for side in rows
        for r in side
        for k in ("step_time_ms", "step_time_iqr_ms")
    ):
        (b,), (r,) = rows
        low, high = band_ratio_interval(
            b["step_time_ms"], b["step_time_iqr_ms"], r["step_time_ms"], r["step_time_iqr_ms"]
        )
        scale = figure / (b["step_time_ms"] / r["step_time_ms"])
        ratio.low, ratio.high = low * scale, high * scale
        ratio.bootstrap = "IQR bands"
    steps = [r.get("measured_steps") for side in rows for r in side]
    counted = [n for n in steps if isinstance(n, int)]
    if len(counted) < len(steps):
        ratio.noise = "steps not recorded"
    elif min(counted) < MIN_MEASURED_STEPS:
        ratio.noise = f"{min(counted)} steps"
    elif ratio.low is None or ratio.high is None:
        ratio.noise = "no step-time spread"
    elif ratio.low <= 1.0 <= ratio.high:
        ratio.noise = "interval spans 1.0"
    # repeats pair in sweep order (interleaved: repeat k of each side ran next to each other)
    pairs = (
        list(zip(base, runs, strict=True))
        if len(base) == len(runs)
        else [(b, r) for b in base for r in runs]
    )
    verdicts = [verdict(r, b) for (b, _), (r, _) in pairs]
    confounded = [v for v in verdicts if v and v.startswith("confounded")]
    said = (confounded or [v for v in verdicts if v] or [None])[0]
    if (why := impossible(column, figure)) is not None:  # never bare, whatever else
        said = f"{said}; {why}" if said and said.startswith("confounded") else f"confounded: {why}"
    ratio.verdict = said
    return ratio


def _telemetry(record: dict[str, Any]) -> Telemetry:
    return TrainRecord.from_json(record).telemetry or {}  # a file may hold null


def noise_marked(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` for printing: each ratio in one cell (:meth:`Ratio.text`: its figure with the
    interval, or marked noise or confounded, or why there is none); the CSV keeps numbers and
    reasons apart. A missing MFU says why (``"n/a (cpu)"``)."""
    shown: list[dict[str, Any]] = []
    for row in rows:
        row = dict(row)
        for names in RATIOS:
            ratio = Ratio.from_row(row, names)
            row[names.value] = ratio.text(lambda x, column=names.value: fmt(x, column))
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
