"""kiln-report's plots and printed tables, as a paper would want them: every line told apart,
legends outside the data, labels holding only what differs, error bars that say what they
span, untrusted ratios greyed and hatched, tables that fit 100 columns."""

from __future__ import annotations

import json

import matplotlib
import numpy as np
import pytest

from kiln.experiments.report.bench import model_rows
from kiln.experiments.report.cli import build_report
from kiln.experiments.report.plots import (
    loss_figure,
    ratio_figure,
    speedup_figure,
    throughput_figure,
)
from kiln.experiments.report.rows import SPEEDUP
from kiln.experiments.report.train import train_rows

matplotlib.use("Agg")
SHARED = ["debug=fast", "trainer.max_steps=40"]


def record(precision, mode, step_s, seed, losses=None):
    """A kiln-train record with 40 measured step times around ``step_s``."""
    rng = np.random.default_rng(seed)
    times = list(step_s * (1 + 0.05 * rng.standard_normal(40)))
    return {
        "kind": "train",
        "status": "ok",
        "overrides": [*SHARED, f"precision={precision}", f"compile={mode}"],
        "model": "bert-tiny-cls",
        "precision": precision,
        "compile_mode": mode,
        "devices": 1,
        "metrics": {"val/accuracy": 0.75, "val/f1": 0.7, "val/loss": 0.5},
        "global_step": 40,
        "telemetry": {
            "step_time_median_s": float(np.median(times)),
            "step_time_iqr_s": float(np.subtract(*np.percentile(times, [75, 25]))),
            "step_times_s": times,
            "measured_steps": 40,
            "samples_per_s": 8 / step_s,
            "compile_time_s": 3.0,
        },
        # eager and compiled runs of one precision train identically: their lines coincide
        "history": [{"step": i + 1, "train/loss": v} for i, v in enumerate(losses or [])],
    }


def sweep_records():
    records = []
    for p, precision in enumerate(("32-true", "bf16-mixed")):
        losses = list(2.0 - 0.03 * np.arange(40) - 0.2 * p)
        for mode, step_s in (("none", 0.030), ("default", 0.020), ("max-autotune", 0.018)):
            records.append(record(precision, mode, step_s, len(records), losses))
    return records


@pytest.fixture
def sweep_dir(tmp_path):
    for i, rec in enumerate(sweep_records()):
        (tmp_path / str(i)).mkdir()
        (tmp_path / str(i) / "summary.json").write_text(json.dumps(rec))
    return tmp_path


def _outside(fig, legend, ax) -> bool:
    renderer = fig.canvas.get_renderer()
    return not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))


def test_loss_lines_all_differ_with_the_legend_outside_and_only_what_differs():
    fig = loss_figure(sweep_records(), "training loss")
    ax = fig.axes[0]
    lines = ax.get_lines()
    assert len(lines) == 6
    styles = {
        (ln.get_color(), ln.get_linestyle(), ln.get_marker(), ln.get_linewidth()) for ln in lines
    }
    assert len(styles) == 6  # coinciding lines (same losses) still tell apart
    # colour per compile mode, line style per precision
    by_label = {ln.get_label(): ln for ln in lines}
    assert by_label["precision=32-true, compile=none"].get_color() == (
        by_label["precision=bf16-mixed, compile=none"].get_color()
    )
    assert by_label["precision=32-true, compile=none"].get_linestyle() == (
        by_label["precision=32-true, compile=default"].get_linestyle()
    )
    legend = ax.get_legend()
    assert _outside(fig, legend, ax)
    texts = [t.get_text() for t in legend.get_texts()]
    assert all("debug=fast" not in t and "max_steps" not in t for t in texts)  # shared: caption
    captions = " ".join(t.get_text() for t in fig.texts)
    assert "all runs: debug=fast, trainer.max_steps=40" in captions


def test_a_training_sweep_gets_a_speedup_plot_with_intervals_and_untrusted_bars_hatched(
    sweep_dir,
):
    report = build_report(sweep_dir, show=False)
    assert "train_speedup.png" in {p.name for p in report["plots"]}
    rows = [r for r in train_rows(sweep_records()) if r["compile_mode"] != "none"]
    rows[0]["confounded"] = "confounded: load 11 vs 2"  # the hook a comparability check sets
    rows[1]["speedup_noise"] = "interval spans 1.0"
    fig = ratio_figure(rows, "speedup", SPEEDUP, "speedup", "1.0 = eager run")
    ax = fig.axes[0]
    bars = ax.patches[: len(rows)]
    assert [b.get_hatch() for b in bars] == ["//", "//", None, None]
    assert [b.get_height() for b in bars] == pytest.approx([r[SPEEDUP.value] for r in rows])
    (errorbars,) = [c for c in ax.containers if hasattr(c, "has_yerr") and c.has_yerr]
    segments = errorbars.lines[2][0].get_segments()
    for (low, high), row in zip(segments, rows, strict=True):
        assert (low[1], high[1]) == pytest.approx((row["speedup_ci_low"], row["speedup_ci_high"]))
    assert [ln.get_ydata()[0] for ln in ax.get_lines() if ln.get_label().startswith("1.0")] == [1]
    captions = " ".join(t.get_text() for t in fig.texts)
    assert "error bars: bootstrap 95% interval" in captions
    assert "confounded: load 11 vs 2" in captions
    assert _outside(fig, ax.get_legend(), ax)


def test_throughput_bars_carry_error_bars_that_say_what_they_are():
    rows = train_rows(sweep_records())
    fig = throughput_figure(rows, "throughput")
    ax = fig.axes[0]
    (errorbars,) = [c for c in ax.containers if hasattr(c, "has_xerr") and c.has_xerr]
    for (low, high), row in zip(errorbars.lines[2][0].get_segments(), rows, strict=True):
        assert low[0] < row["samples_per_s"] < high[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0] == "precision=32-true, compile=default"
    assert "error bars: throughput at the steady step time's median +- IQR/2" in " ".join(
        t.get_text() for t in fig.texts
    )


def test_the_bench_control_is_the_reference_line_not_a_bar():
    def bench(model, mode, speedup):
        return {
            "model": model,
            "compile_mode": mode,
            "precision": "32-true",
            "status": "pass",
            "speedup": speedup,
            "speedup_ci_low": speedup * 0.9,
            "speedup_ci_high": speedup * 1.1,
            "significant": True,
        }

    rows = model_rows(
        [bench("a", "default", 1.5), bench("b", "default", 0.8), bench("a", "none", 1.04)]
    )
    fig = speedup_figure(rows, "speedup")
    ax = fig.axes[0]
    assert [round(b.get_height(), 3) for b in ax.patches] == [1.5, 0.8]  # no control bar
    (reference,) = [ln for ln in ax.get_lines() if "control" in ln.get_label()]
    assert list(reference.get_ydata()) == [1.0, 1.0]
    assert "control compile=none measured 1.04" in reference.get_label()
    assert "error bars: bootstrap 95% interval of the speedup" in fig.texts[0].get_text()
    assert _outside(fig, ax.get_legend(), ax)


def test_printed_tables_fit_100_columns_and_report_md_states_the_method_once(sweep_dir, capsys):
    build_report(sweep_dir)
    printed = capsys.readouterr().out
    table_lines = [line for line in printed.splitlines() if line[:1] in "┏┃┡│└"]
    assert table_lines and max(len(line) for line in table_lines) <= 100
    assert max(len(line) for line in printed.splitlines() if not line.startswith("wrote")) <= 100
    assert "all columns: report.md, train_runs.csv" in printed
    md = (sweep_dir / "report.md").read_text()
    assert md.count("steady step time = median optimizer-step time") == 1
