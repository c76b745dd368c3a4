"""kiln-report's panel of the machine through the compared runs: the series summed up in
report.md and drawn against the optimizer step in machine.png."""

from __future__ import annotations

import pytest

from kiln.experiments.report.cli import compared_runs
from kiln.experiments.report.machine_panel import (
    machine_markdown,
    machine_plot,
    machine_rows,
    sample_steps,
    step_axis,
)


def _run(others: list[float], clock: list[int] | None = None) -> dict:
    """Four one-second samples over steps 0-400 (100 steps each), 400 measured steps after 3
    warm-up steps, the job on 1.9 cores but where others took the machine."""
    starts = [0, 100, 200, 300]
    samples = {
        "t_s": [0.0, 1.0, 2.0, 3.0],
        "seconds": [1.0] * 4,
        "step_start": starts,
        "step_end": [s + 100 for s in starts],
        "other_cpu_cores": others,
        "own_cpu_cores": [1.9 if o < 1 else 0.6 for o in others],
    }
    if clock is not None:
        samples["sm_clock_mhz"] = clock
        samples["throttle_reasons"] = [0] * 4
    series = {"interval_s": 1.0, "measured_from_step": 3, "samples": samples}
    telemetry = {"step_times_s": [0.01] * 200, "measured_steps": 400, "machine_series": series}
    return {"telemetry": telemetry}


def test_the_table_names_the_worst_sample_and_the_steps_it_covered():
    rows = machine_rows([("busy", _run([0.0, 3.8, 3.7, 0.1])), ("idle", _run([0.0] * 4))])
    busy, idle = rows
    assert busy["samples"] == 4
    assert busy["other_cpu_cores_extreme"] == 3.8 and busy["other_cpu_cores_steps"] == "101-200"
    assert busy["own_cpu_cores_extreme"] == 0.6 and busy["own_cpu_cores_steps"] == "101-200"
    assert busy["other_cpu_cores_median"] == pytest.approx(1.9)
    assert "sm_clock_mhz_median" not in busy  # no GPU, no clock
    assert idle["other_cpu_cores_extreme"] == 0.0
    md = "\n".join(machine_markdown(rows))
    assert "| busy | 4 | 1.90, 3.80 (101-200) | 1.25, 0.60 (101-200) | - |" in md
    assert "![machine](machine.png)" in md


def test_a_gpu_runs_clock_is_summed_up_at_its_lowest():
    (row,) = machine_rows([("gpu", _run([0.0] * 4, clock=[1980, 1980, 1410, 1980]))])
    assert row["sm_clock_mhz_extreme"] == 1410 and row["sm_clock_mhz_steps"] == "201-300"


def test_steps_and_samples_share_the_step_axis():
    run = _run([0.0] * 4)
    steps, times = step_axis(run)  # 200 of 400 measured steps kept: every other one
    assert steps[:3] == [4, 6, 8] and len(times) == 200 and times[0] == pytest.approx(10.0)
    assert sample_steps(run["telemetry"]["machine_series"]["samples"]) == [
        50.5,
        150.5,
        250.5,
        350.5,
    ]


def test_the_panel_is_drawn(tmp_path):
    runs = [("busy", _run([0.0, 3.8, 3.7, 0.1], clock=[1980] * 4)), ("idle", _run([0.0] * 4))]
    png = machine_plot(runs, tmp_path / "machine.png")
    assert png.stat().st_size > 10_000


def test_only_the_runs_a_ratio_compares_are_shown():
    records = [
        {"overrides": ["compile=none"], **_run([0.0] * 4)},
        {"overrides": ["compile=default"], **_run([0.0] * 4)},
        {"overrides": ["compile=max-autotune"], **_run([0.0] * 4)},
    ]
    rows = [
        {"run": "compile=none", "speedup_vs_eager": 1.0},
        {"run": "compile=default", "speedup_vs_eager": 1.4},
        {"run": "compile=max-autotune", "speedup_vs_eager": None},
    ]
    assert [name for name, _ in compared_runs(records, rows)] == [
        "compile=none",
        "compile=default",
    ]
