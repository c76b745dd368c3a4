"""PNG plots of a report (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kiln.core.optional import require


def _pyplot():
    matplotlib = require("matplotlib", "kiln-experiments[plots]")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _grey_out(bar: Any) -> None:
    """Draw ``bar`` grey and cross-hatched: its figure is no result (confounded, noisy)."""
    bar.set_facecolor("lightgrey")
    bar.set_edgecolor("dimgrey")
    bar.set_hatch("xx")
    if hasattr(bar, "set_hatchcolor"):  # matplotlib >= 3.10; older ones hatch in black
        bar.set_hatchcolor("dimgrey")


def speedup_bars(
    rows: Sequence[dict[str, Any]], path: Path, title: str, noisy: Sequence[str] = ()
) -> Path:
    """Grouped bars: speedup of each model under each (compile mode, precision).

    Error bars span the p25-p75 of the per-pair ratios; a run that did not pass is drawn
    as an empty, hatched bar at its measured speedup (or at 0 when there is none); the bars
    at a ``noisy`` precision (its control was off 1.0) are grey and cross-hatched.
    """
    plt = _pyplot()
    models = sorted({str(r["model"]) for r in rows})
    configs = sorted({(str(r["compile_mode"]), str(r["precision"])) for r in rows})
    width = 0.8 / max(len(configs), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(models) * max(1, len(configs)) / 2), 4.5))
    for k, (mode, precision) in enumerate(configs):
        xs, ys, lo, hi, passed = [], [], [], [], []
        for i, model in enumerate(models):
            match = [
                r
                for r in rows
                if str(r["model"]) == model
                and str(r["compile_mode"]) == mode
                and str(r["precision"]) == precision
            ]
            if not match:
                continue
            r = match[0]
            y = r["speedup"] or 0.0
            xs.append(i - 0.4 + width * (k + 0.5))
            ys.append(y)
            lo.append(max(y - (r["speedup_p25"] if r["speedup_p25"] is not None else y), 0))
            hi.append(max((r["speedup_p75"] if r["speedup_p75"] is not None else y) - y, 0))
            passed.append(r["status"] == "pass")
        label = f"{mode} / {precision}" + (" (noisy machine)" if precision in noisy else "")
        bars = ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=label)
        for bar, ok in zip(bars, passed, strict=True):
            if precision in noisy:
                _grey_out(bar)
            if not ok:
                bar.set_fill(False)
                bar.set_hatch("//")
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels(models, rotation=30, ha="right")
    ax.set_ylabel("speedup (median eager / median compiled)")
    ax.set_title(title)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def line_plot(curves: dict[str, tuple[list, list]], path: Path, title: str, ylabel: str) -> Path:
    """One line per run (e.g. training loss against optimizer step), overlaid."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, (steps, values) in sorted(curves.items()):
        ax.plot(steps, values, label=name, linewidth=1.2)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(curves) <= 12:
        ax.legend(fontsize="x-small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def throughput_bars(rows: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """Horizontal bars of each run's throughput (samples/s); a run whose speedup or scaling
    efficiency is confounded (another machine, calibration or load than its partner's) is
    grey and hatched."""
    plt = _pyplot()
    rows = [r for r in rows if r.get("samples_per_s")]
    fig, ax = plt.subplots(figsize=(8, max(2.5, 0.35 * len(rows) + 1)))
    bars = ax.barh([r["run"] for r in rows], [r["samples_per_s"] for r in rows])
    confounded = False
    for bar, row in zip(bars, rows, strict=True):
        verdicts = [str(row.get(k) or "") for k in ("speedup_verdict", "scaling_verdict")]
        if any(v.startswith("confounded") for v in verdicts):
            _grey_out(bar)
            confounded = True
    if confounded:
        ax.text(
            0.99,
            0.01,
            "hatched: ratio confounded",
            transform=ax.transAxes,
            ha="right",
            va="bottom",
            fontsize="small",
            color="grey",
        )
    ax.set_xlabel("samples / s")
    ax.set_title(title)
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def scatter_plot(
    points: Sequence[tuple[float, float]], path: Path, title: str, xlabel: str, ylabel: str
) -> Path:
    """One point per run: ``ylabel`` against ``xlabel`` (log x when it spans > 2 decades)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    ax.scatter(xs, ys)
    positive = [x for x in xs if x > 0]
    if positive and len(positive) == len(xs) and max(positive) / min(positive) > 100:
        ax.set_xscale("log")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path
