"""PNG plots of a report (matplotlib, Agg backend: no display needed).

Plots meant to go into a paper as they are: every line and bar tells its run apart
(colour per compile mode, line style per precision, a marker for runs that share both),
labels hold only what differs between runs (what they share is in the caption), legends sit
outside the data, error bars say what they span, and a ratio that is not a result (noise, or
a row with a truthy ``confounded`` entry) is drawn grey and hatched.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kiln.core.optional import require
from kiln.core.telemetry.profile import CATEGORY_ORDER
from kiln.experiments.report.labels import differing_labels
from kiln.experiments.report.profiles import ProfilePair, host_ms
from kiln.experiments.report.rows import SCALING, SPEEDUP, Ratio, RatioColumns

_LINESTYLES = ["-", "--", ":", "-."]
_MARKERS = ["o", "s", "^", "v", "D", "x", "+", "*"]
_UNTRUSTED = {"facecolor": "0.82", "hatch": "//", "edgecolor": "0.45"}


def _pyplot():
    matplotlib = require("matplotlib", "kiln-experiments[plots]")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    fig.savefig(path, dpi=120, bbox_inches="tight")  # keeps a legend outside the axes
    _pyplot().close(fig)
    return path


def _caption(fig: Any, lines: Sequence[str]) -> None:
    """Small text under the axes and their tick labels: what every run shares, what error
    bars span."""
    text = "\n".join(line for line in lines if line)
    if not text:
        return
    below = min(
        ax.get_tightbbox(fig.canvas.get_renderer()).transformed(fig.transFigure.inverted()).y0
        for ax in fig.axes
    )
    fig.text(0.01, below - 0.03, text, ha="left", va="top", fontsize="x-small")


def _legend_outside(ax: Any, **kwargs: Any) -> Any:
    return ax.legend(
        loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, fontsize="small", **kwargs
    )


def _shared_text(shared: Sequence[str]) -> str:
    return f"all runs: {', '.join(shared)}" if shared else ""


def _grey_out(bar: Any) -> None:
    """Draw ``bar`` as a figure that is no result (noise, confounded, failed)."""
    bar.set(facecolor=_UNTRUSTED["facecolor"], edgecolor=_UNTRUSTED["edgecolor"])
    bar.set_hatch(_UNTRUSTED["hatch"])


def untrusted(
    row: dict[str, Any], noise_column: str | None = None, verdict_column: str | None = None
) -> str | None:
    """Why ``row``'s ratio is not a result (drawn grey, hatched), or ``None``: a truthy
    ``confounded`` entry (its text), a ``confounded: ...`` verdict (kiln-report's comparison of
    the two runs' machines), a noise reason, a run that did not pass."""
    confounded = row.get("confounded")
    if confounded:
        return confounded if isinstance(confounded, str) else "confounded"
    said = str(row.get(verdict_column) or "") if verdict_column else ""
    if said.startswith("confounded"):
        return said
    if noise_column and row.get(noise_column):
        return f"noise: {row[noise_column]}"
    if row.get("status") not in (None, "ok", "pass"):
        return str(row.get("status"))
    return None


def run_styles(runs: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """Matplotlib line styles, one per (compile mode, precision) run: colour and marker per
    compile mode, line style per precision (runs that share both take the next line style),
    each line and its hollow markers smaller than the ones drawn before it, so lines that
    coincide (eager and compiled runs often train identically) still show."""
    plt = _pyplot()
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    modes = list(dict.fromkeys(m for m, _ in runs))
    precisions = list(dict.fromkeys(p for _, p in runs))
    seen: dict[tuple[str, str], int] = {}
    styles = []
    for i, (mode, precision) in enumerate(runs):
        repeat = seen.get((mode, precision), 0)
        seen[(mode, precision)] = repeat + 1
        style = precisions.index(precision) + repeat * len(precisions)
        styles.append(
            {
                "color": colors[modes.index(mode) % len(colors)],
                "marker": _MARKERS[modes.index(mode) % len(_MARKERS)],
                "linestyle": _LINESTYLES[style % len(_LINESTYLES)],
                "linewidth": max(1.0, 3.5 - 0.8 * i),
                # hollow, each smaller than the one before: coinciding markers nest
                "markersize": max(4.0, 10.0 - 1.5 * i),
                "markerfacecolor": "none",
                "markeredgewidth": 1.5,
            }
        )
    return styles


# -- kiln-bench ---------------------------------------------------------------------------


def speedup_bars(
    rows: Sequence[dict[str, Any]], path: Path, title: str, noisy: Sequence[str] = ()
) -> Path:
    """:func:`speedup_figure` saved to ``path``."""
    return _save(speedup_figure(rows, title, noisy), path)


def speedup_figure(rows: Sequence[dict[str, Any]], title: str, noisy: Sequence[str] = ()) -> Any:
    """Grouped bars: speedup of each model under each (compile mode, precision); the groups
    at a ``noisy`` precision (its control read off 1.0) are not results.

    The control (``compile=none``: eager against eager) is no bar: it is the reference line
    at 1.0, and its measured ratios are printed in the legend (how far the machine's noise
    moves a ratio that must be 1.0). Error bars are the bootstrap 95% interval of the
    speedup (the p25-p75 of the per-pair ratios where a record has no interval); a run
    that did not pass the accuracy check, or a row marked ``confounded``, is a grey hatched
    bar at its measured speedup (or 0 when there is none).
    """
    plt = _pyplot()
    controls = [r for r in rows if str(r["compile_mode"]) == "none"]
    rows = [r for r in rows if str(r["compile_mode"]) != "none"]
    models = sorted({str(r["model"]) for r in rows} or {str(r["model"]) for r in controls})
    configs = sorted({(str(r["compile_mode"]), str(r["precision"])) for r in rows})
    width = 0.8 / max(len(configs), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(models) * max(1, len(configs)) / 2), 4.5))
    used_interval, marked = False, False
    for k, (mode, precision) in enumerate(configs):
        xs, ys, lo, hi, flags = [], [], [], [], []
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
            low, high = r.get("speedup_ci_low"), r.get("speedup_ci_high")
            if low is None or high is None:
                low, high = r.get("speedup_p25"), r.get("speedup_p75")
            else:
                used_interval = True
            xs.append(i - 0.4 + width * (k + 0.5))
            ys.append(y)
            lo.append(max(y - (low if low is not None else y), 0))
            hi.append(max((high if high is not None else y) - y, 0))
            flags.append("noisy machine" if precision in noisy else untrusted(r))
        label = f"{mode} / {precision}" + (" (noisy machine)" if precision in noisy else "")
        bars = ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=label)
        for bar, flag in zip(bars, flags, strict=True):
            if flag:
                marked = True
                _grey_out(bar)
    ax.axhline(1.0, color="black", linewidth=1.0, linestyle="--", label=_control_label(controls))
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels(models, rotation=30, ha="right")
    ax.set_ylabel("speedup (median eager / median compiled)")
    ax.set_title(title)
    _legend_outside(ax, title="compile mode / precision")
    interval = (
        "bootstrap 95% interval of the speedup (the interleaved pairs resampled)"
        if used_interval
        else "p25-p75 of the per-pair eager/compiled step-time ratios"
    )
    _caption(
        fig,
        [
            f"error bars: {interval}",
            "grey, hatched: not a result (accuracy check failed, noisy machine or confounded)"
            if marked
            else "",
        ],
    )
    return fig


def _control_label(controls: Sequence[dict[str, Any]]) -> str:
    """The reference line's legend entry, with the control's measured ratios."""
    measured = sorted(r["speedup"] for r in controls if isinstance(r.get("speedup"), int | float))
    if not measured:
        return "1.0 = eager"
    span = f"{measured[0]:.2f}" if len(measured) == 1 else f"{measured[0]:.2f}-{measured[-1]:.2f}"
    return f"1.0 = eager (control compile=none measured {span})"


# -- kiln-train ---------------------------------------------------------------------------


def loss_plot(
    records: Sequence[dict[str, Any]], path: Path, title: str, key: str = "train/loss"
) -> Path:
    """:func:`loss_figure` saved to ``path``."""
    return _save(loss_figure(records, title, key), path)


def loss_figure(records: Sequence[dict[str, Any]], title: str, key: str = "train/loss") -> Any:
    """One line per run of ``key`` against the optimizer step: colour per compile mode, line
    style per precision, a marker for runs that share both; the legend (what differs between
    the runs) outside the axes, what they share in the caption."""
    from kiln.experiments.report.train import loss_curves, run_name

    plt = _pyplot()
    curves = loss_curves(list(records), key)
    by_name = {run_name(r): r for r in records}
    names = sorted(curves)
    labels, shared = differing_labels(names, sep=", ")
    runs = [(str(by_name[n].get("compile_mode")), str(by_name[n].get("precision"))) for n in names]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, label, style in zip(names, labels, run_styles(runs), strict=True):
        steps, values = curves[name]
        ax.plot(steps, values, label=label, markevery=0.1, **style)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(key)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    _legend_outside(ax)
    _caption(fig, ["colour and marker: compile mode, line style: precision", _shared_text(shared)])
    return fig


def ratio_bars(rows: Sequence[dict[str, Any]], path: Path, *args: Any, **kwargs: Any) -> Path:
    """:func:`ratio_figure` saved to ``path``."""
    return _save(ratio_figure(rows, *args, **kwargs), path)


def ratio_figure(
    rows: Sequence[dict[str, Any]],
    title: str,
    columns: RatioColumns,
    ylabel: str,
    reference: str,
    sweep_runs: Sequence[str] = (),
) -> Any:
    """One bar per run of a ratio (``columns``: where the rows hold it) with its bootstrap
    95% interval; a line at 1.0 (``reference`` names it); noise and ``confounded`` rows grey
    and hatched. Labels hold what differs between ``sweep_runs`` (every run of the sweep, the
    reference runs too; default: ``rows``' runs)."""
    plt = _pyplot()
    ratios = [Ratio.from_row(r, columns) for r in rows]
    names = list(dict.fromkeys([*sweep_runs, *(str(r["run"]) for r in rows)]))
    all_labels, shared = differing_labels(names, sep="\n")
    labels = [all_labels[names.index(str(r["run"]))] for r in rows]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(rows) + 2.5), 4.2))
    ys = [float(r.value or 0.0) for r in ratios]
    lo = [max(y - r.low, 0) if r.low is not None else 0 for y, r in zip(ys, ratios, strict=True)]
    hi = [max(r.high - y, 0) if r.high is not None else 0 for y, r in zip(ys, ratios, strict=True)]
    bars = ax.bar(range(len(rows)), ys, 0.6, yerr=[lo, hi], capsize=4, color="C0")
    flags = [untrusted(r, columns.noise, columns.verdict) for r in rows]
    for bar, flag in zip(bars, flags, strict=True):
        if flag:
            _grey_out(bar)
    ax.axhline(1.0, color="black", linewidth=1.0, linestyle="--", label=reference)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize="small")
    ax.set(ylabel=ylabel, title=title)
    handles, names = ax.get_legend_handles_labels()
    if any(flags):
        from matplotlib.patches import Patch

        handles.append(Patch(**_UNTRUSTED))
        names.append("not a result (noise or confounded)")
    ax.legend(handles, names, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    _caption(
        fig,
        [
            "error bars: bootstrap 95% interval of the ratio of the two runs' step times",
            *[
                f"{label.replace(chr(10), ', ')}: {flag}"
                for label, flag in zip(labels, flags, strict=True)
                if flag
            ],
            _shared_text(shared),
        ],
    )
    return fig


def ratio_plots(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """``train_speedup.png`` (the compiled runs' speedup against eager) and
    ``scaling.png`` (the scaling efficiency of the runs on more devices than their base),
    each with its interval, where the sweep has such runs."""
    plots, runs = [], [str(r["run"]) for r in rows]
    compiled = [r for r in rows if r[SPEEDUP.value] and r["compile_mode"] != "none"]
    if compiled:
        png, title = out / "train_speedup.png", "torch.compile speedup against eager"
        ylabel = "speedup (eager step time / compiled)"
        plots.append(ratio_bars(compiled, png, title, SPEEDUP, ylabel, "1.0 = eager run", runs))
    scaling = [(r, Ratio.from_row(r, SCALING)) for r in rows]
    scaled = [r for r, s in scaling if s.value and (s.low is not None or s.noise)]
    if scaled:
        png, title = out / "scaling.png", "scaling efficiency against the fewest devices"
        ylabel = "throughput per device / the base run's"
        plots.append(ratio_bars(scaled, png, title, SCALING, ylabel, "1.0 = linear scaling", runs))
    return plots


def throughput_bars(rows: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """:func:`throughput_figure` saved to ``path``."""
    return _save(throughput_figure(rows, title), path)


def throughput_figure(rows: Sequence[dict[str, Any]], title: str) -> Any:
    """Horizontal bars of each run's throughput (samples/s), whiskers at the throughput of
    the step time's band (median +- IQR/2)."""
    plt = _pyplot()
    rows = [r for r in rows if r.get("samples_per_s")]
    labels, shared = differing_labels([str(r["run"]) for r in rows], sep=", ")
    runs = [(str(r.get("compile_mode")), str(r.get("precision"))) for r in rows]
    colors = [style["color"] for style in run_styles(runs)]
    values = [float(r["samples_per_s"]) for r in rows]
    lo, hi = [], []
    for value, r in zip(values, rows, strict=True):
        median, iqr = r.get("step_time_ms"), r.get("step_time_iqr_ms")
        if isinstance(median, int | float) and isinstance(iqr, int | float) and median > iqr / 2:
            lo.append(value - value * median / (median + iqr / 2))
            hi.append(value * median / (median - iqr / 2) - value)
        else:
            lo.append(0.0)
            hi.append(0.0)
    fig, ax = plt.subplots(figsize=(7, max(2.5, 0.4 * len(rows) + 1)))
    ax.barh(range(len(rows)), values, xerr=[lo, hi], capsize=3, color=colors)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels, fontsize="small")
    ax.set_xlabel("samples / s (all devices)")
    ax.set_title(title)
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)
    _caption(
        fig,
        [
            "error bars: throughput at the steady step time's median +- IQR/2; "
            "colour: compile mode",
            _shared_text(shared),
        ],
    )
    return fig


# -- studies ------------------------------------------------------------------------------


def scatter_plot(path: Path, **kwargs: Any) -> Path:
    """:func:`scatter_figure` of ``kwargs`` saved to ``path``."""
    return _save(scatter_figure(**kwargs), path)


def scatter_figure(
    points: Sequence[tuple[float, float]],
    title: str,
    xlabel: str,
    ylabel: str,
    log_x: bool | None = None,
    best: tuple[float, float] | None = None,
) -> Any:
    """One point per run: ``ylabel`` against ``xlabel``.

    Args:
        log_x: A log x axis (a parameter searched on a log scale); ``None``: log when the
            values span more than two decades.
        best: The best trial's point, drawn as a star.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    ax.scatter(xs, ys, label="trial", color="C0")
    if best is not None:
        label = f"best trial: {xlabel}={best[0]:.4g}, {ylabel}={best[1]:.4g}"
        ax.scatter([best[0]], [best[1]], marker="*", s=220, color="C3", zorder=3, label=label)
    positive = [x for x in xs if x > 0]
    if log_x is None:
        log_x = bool(positive) and len(positive) == len(xs) and max(positive) / min(positive) > 100
    if log_x:
        ax.set_xscale("log")
    ax.set(title=title, xlabel=xlabel + (" (log scale)" if log_x else ""), ylabel=ylabel)
    ax.grid(alpha=0.3)
    _legend_outside(ax)
    return fig


def profile_bars(pairs: Sequence[ProfilePair], path: Path) -> Path:
    """Two stacked bars per pair of profiled runs (base, other): ms per step by category."""
    return _save(profile_figure(pairs), path)


def profile_figure(pairs: Sequence[ProfilePair]) -> Any:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(pairs) + 2), 3.6))
    colours = plt.get_cmap("tab10")
    labels: list[str] = []
    positions: list[int] = []
    for i, pair in enumerate(pairs):
        for j, record in enumerate((pair.base, pair.other)):
            x, bottom, spent = i * 3 + j, 0.0, host_ms(record)
            for k, category in enumerate(CATEGORY_ORDER):
                value = spent.get(category, 0.0)
                ax.bar(x, value, bottom=bottom, color=colours(k), label=None if x else category)
                bottom += value
            positions.append(x)
            labels.append(pair.label(record))
    ax.set_xticks(positions, labels, rotation=30, ha="right", fontsize="small")
    ax.set_ylabel("ms per step (profiled)")
    ax.set_title("where the step time goes")
    _legend_outside(ax)
    _caption(fig, [f"pairs: {'; '.join(p.title for p in pairs)}"])
    return fig
