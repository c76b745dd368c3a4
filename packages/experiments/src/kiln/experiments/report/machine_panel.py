"""The machine through each compared run, aligned with its steps: ``machine.png`` and a table.

Every run a ratio compares (a speedup's or a scaling efficiency's two sides) keeps the machine
sampled through training (telemetry ``machine_series``) and its measured step times. The
panel draws them against the optimizer step: the step times, other processes' CPU in cores,
the job's own CPU in cores and, on CUDA, the SM clock; a sample is drawn over the steps its
window covered. The table sums each series up (median, and the extreme with its steps).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

PANELS = (
    ("other_cpu_cores", "others' CPU (cores)"),
    ("own_cpu_cores", "own CPU (cores)"),
    ("sm_clock_mhz", "SM clock (MHz)"),
)
"""The machine series drawn, each on its own axes, in order (the SM clock only on CUDA)."""


def _series(record: dict[str, Any]) -> dict[str, list[Any]]:
    telemetry = record.get("telemetry") or {}
    return ((telemetry.get("machine_series") or {}).get("samples")) or {}


def step_axis(record: dict[str, Any]) -> tuple[list[int], list[float]]:
    """The measured steps' numbers and times (ms) of a run, as its telemetry thinned them."""
    telemetry = record.get("telemetry") or {}
    times = telemetry.get("step_times_s") or []
    if not times:
        return [], []
    first = int((telemetry.get("machine_series") or {}).get("measured_from_step") or 0) + 1
    stride = math.ceil((telemetry.get("measured_steps") or len(times)) / len(times))
    return [first + i * stride for i in range(len(times))], [t * 1e3 for t in times]


def sample_steps(columns: dict[str, list[Any]]) -> list[float]:
    """Where each sample sits on the step axis: the middle of the steps its window covered
    (a sample in which no step ended sits on the step in progress)."""
    starts, ends = columns.get("step_start") or [], columns.get("step_end") or []
    return [(s + 1 + max(e, s + 1)) / 2 for s, e in zip(starts, ends, strict=True)]


def machine_rows(records: Sequence[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per named run with a machine series: samples, and per series its median and
    its extreme (most others' cores, least own cores, lowest clock) with the steps it covered."""
    rows: list[dict[str, Any]] = []
    for name, record in records:
        columns = _series(record)
        if not columns.get("step_end"):
            continue
        row: dict[str, Any] = {"run": name, "samples": len(columns["step_end"])}
        for key, _ in PANELS:
            values = columns.get(key) or []
            picks = [i for i, v in enumerate(values) if isinstance(v, int | float)]
            if not picks:
                continue
            worst = (max if key == "other_cpu_cores" else min)(picks, key=lambda i: values[i])
            start, end = columns["step_start"][worst], columns["step_end"][worst]
            row[f"{key}_median"] = float(np.median([values[i] for i in picks]))
            row[f"{key}_extreme"] = float(values[worst])
            row[f"{key}_steps"] = f"{start + 1}-{max(end, start + 1)}"
        rows.append(row)
    return rows


def machine_markdown(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The report's section: a table of :func:`machine_rows` and the panel."""
    lines = [
        "## The machine through the compared runs",
        "",
        "Sampled through training, aligned with the steps in `machine.png`; the extreme is the",
        "most others used, the least the job got, the lowest SM clock, with the steps it covered.",
        "",
        "| run | samples | others' cores: median, most (steps) | own cores: median, least "
        "(steps) | SM clock MHz: median, lowest (steps) |",
        "|---|---|---|---|---|",
    ]

    def cell(row: dict[str, Any], key: str, digits: int) -> str:
        if f"{key}_median" not in row:
            return "-"
        median, extreme = row[f"{key}_median"], row[f"{key}_extreme"]
        return f"{median:.{digits}f}, {extreme:.{digits}f} ({row[f'{key}_steps']})"

    for row in rows:
        cells = [cell(row, key, 0 if key == "sm_clock_mhz" else 2) for key, _ in PANELS]
        lines.append(f"| {row['run']} | {row['samples']} | {' | '.join(cells)} |")
    return [*lines, "", "![machine](machine.png)"]


def machine_figure(records: Sequence[tuple[str, dict[str, Any]]]) -> Any:
    """Step times and the machine series of each named run against the optimizer step."""
    from kiln.experiments.report.labels import differing_labels
    from kiln.experiments.report.plots import _legend_outside, _pyplot

    labels, _ = differing_labels([name for name, _ in records], sep=", ")
    records = [(label, record) for label, (_, record) in zip(labels, records, strict=True)]
    plt = _pyplot()
    panels = [p for p in PANELS if any(_series(r).get(p[0]) for _, r in records)]
    fig, axes = plt.subplots(
        len(panels) + 1, 1, sharex=True, figsize=(8.0, 1.7 * (len(panels) + 1) + 0.6)
    )
    for k, (name, record) in enumerate(records):
        colour = plt.get_cmap("tab10")(k % 10)
        steps, times = step_axis(record)
        axes[0].plot(steps, times, lw=0.7, color=colour, label=name)
        columns = _series(record)
        where = sample_steps(columns)
        for ax, (key, _) in zip(axes[1:], panels, strict=True):
            values = columns.get(key) or []
            points = [
                (x, v) for x, v in zip(where, values, strict=False) if isinstance(v, int | float)
            ]
            if points:
                ax.step(*zip(*points, strict=True), where="mid", color=colour, lw=1.0)
    axes[0].set_ylabel("step (ms)")
    axes[0].set_yscale("log")
    for ax, (_, label) in zip(axes[1:], panels, strict=True):
        ax.set_ylabel(label, fontsize="small")
    axes[-1].set_xlabel("optimizer step")
    axes[0].set_title("the machine through the compared runs")
    _legend_outside(axes[0])
    return fig


def machine_plot(records: Sequence[tuple[str, dict[str, Any]]], path: Path) -> Path:
    """:func:`machine_figure` saved to ``path``."""
    from kiln.experiments.report.plots import _save

    return _save(machine_figure(records), path)
