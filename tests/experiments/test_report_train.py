"""kiln-report on a training sweep: speedup against eager, scaling efficiency, loss curves."""

import csv
import json

import numpy as np
import pytest

from kiln.experiments.report.cli import build_report
from kiln.experiments.report.train import (
    MIN_MEASURED_STEPS,
    loss_curves,
    noise_marked,
    run_name,
    train_rows,
)


def summary(overrides, compile_mode, devices, step_s, samples_per_s, losses):
    return {
        "kind": "train",
        "status": "ok",
        "error": None,
        "overrides": overrides,
        "job_name": "train",
        "sweep_dir": "x",
        "model": "bert-tiny-cls",
        "precision": "32-true",
        "compile_mode": compile_mode,
        "devices": devices,
        "accumulate_grad_batches": 1,
        "metrics": {"val/accuracy": 0.75},
        "train_loss": losses[-1],
        "global_step": len(losses),
        "telemetry": {
            "compile_time_s": 5.0,
            "recompiles": 0,
            "graph_breaks": 0,
            "step_time_median_s": step_s,
            "step_time_iqr_s": 0.001,
            "samples_per_s": samples_per_s,
            "tokens_per_s": None,
            "peak_memory_mb": 50.0,
            "skipped_steps": 0,
        },
        "history": [{"step": i + 1, "train/loss": v} for i, v in enumerate(losses)],
        "machine": {"device": "cpu", "torch": "2.x", "cuda": None, "hostname": "box"},
        "wandb": None,
        "config": {},
    }


RECORDS = [
    summary(["compile=none", "trainer.devices=1"], "none", 1, 0.020, 400.0, [2.0, 1.0]),
    summary(["compile=default", "trainer.devices=1"], "default", 1, 0.010, 800.0, [2.0, 0.9]),
    summary(["compile=none", "trainer.devices=2"], "none", 2, 0.025, 600.0, [2.0, 1.1]),
]


def test_speedup_against_eager_and_scaling_efficiency():
    rows = {r["run"]: r for r in train_rows(RECORDS)}
    assert rows["compile=none,trainer.devices=1"]["speedup_vs_eager"] == pytest.approx(1.0)
    assert rows["compile=default,trainer.devices=1"]["speedup_vs_eager"] == pytest.approx(2.0)
    assert rows["compile=none,trainer.devices=2"]["speedup_vs_eager"] == pytest.approx(1.0)
    # 600 samples/s on 2 devices against 400 on 1: 75% of linear scaling
    assert rows["compile=none,trainer.devices=2"]["scaling_efficiency"] == pytest.approx(0.75)
    assert rows["compile=none,trainer.devices=1"]["scaling_efficiency"] == pytest.approx(1.0)
    assert rows["compile=default,trainer.devices=1"]["scaling_efficiency"] is None  # no peers
    assert rows["compile=default,trainer.devices=1"]["val/accuracy"] == 0.75
    assert rows["compile=default,trainer.devices=1"]["step_time_ms"] == pytest.approx(10.0)


def test_without_overrides_runs_match_on_fields():
    records = [
        summary([], "none", 1, 0.03, 100.0, [1.0]),
        summary([], "max-autotune", 1, 0.01, 300.0, [1.0]),
    ]
    speedups = sorted(r["speedup_vs_eager"] for r in train_rows(records))
    assert speedups == pytest.approx([1.0, 3.0])


def test_report_and_wandb_name_runs_with_the_same_override_filter():
    from kiln.experiments.report.train import run_name
    from kiln.experiments.settings.job_info import JobInfo

    overrides = ["launcher=local_submitit", "hydra/launcher=basic", "compile=none"]
    assert run_name({"overrides": overrides}) == "compile=none"
    assert JobInfo(output_dir="x", overrides=overrides).run_name == "compile=none"


def test_loss_curves():
    curves = loss_curves(RECORDS)
    assert curves["compile=default,trainer.devices=1"] == ([1, 2], [2.0, 0.9])


def test_report_on_a_training_sweep(tmp_path):
    for i, record in enumerate(RECORDS):
        (tmp_path / str(i)).mkdir()
        (tmp_path / str(i) / "summary.json").write_text(json.dumps(record))
    report = build_report(tmp_path, show=False)
    names = {p.name for p in report["files"]}
    assert {"report.md", "train_runs.csv", "loss.png", "throughput.png"} <= names
    with (tmp_path / "train_runs.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 3 and "val/accuracy" in rows[0] and "speedup_vs_eager" in rows[0]
    assert "## Training runs" in (tmp_path / "report.md").read_text()


def timed(record, measured_steps, iqr_s):
    """``record`` with its telemetry's measured step count and step-time IQR set."""
    record = json.loads(json.dumps(record))
    record["telemetry"].update(measured_steps=measured_steps, step_time_iqr_s=iqr_s)
    return record


def pair(steps, eager_s, compiled_s, iqr_s):
    """An eager and a compiled run of the same config, ``steps`` measured steps each."""
    return [
        timed(summary(["compile=none"], "none", 1, eager_s, 100.0, [1.0]), steps, iqr_s),
        timed(summary(["compile=default"], "default", 1, compiled_s, 200.0, [1.0]), steps, iqr_s),
    ]


def compiled_row(records):
    return next(r for r in train_rows(records) if r["compile_mode"] == "default")


def test_a_speedup_from_few_steps_is_noise_and_never_printed_bare(tmp_path):
    # clearly separated times, but only 10 measured steps per run
    records = pair(10, 0.020, 0.010, 0.001)
    row = compiled_row(records)
    assert row["speedup_vs_eager"] == pytest.approx(2.0)
    assert row["speedup_noise"] == "10 steps"
    for i, record in enumerate(records):
        (tmp_path / str(i)).mkdir()
        (tmp_path / str(i) / "summary.json").write_text(json.dumps(record))
    build_report(tmp_path, show=False)
    report = (tmp_path / "report.md").read_text()
    assert "2.000 (noise: 10 steps)" in report
    assert f"fewer than {MIN_MEASURED_STEPS} steps" in report  # the rule is in the header
    with (tmp_path / "train_runs.csv").open() as handle:
        csv_row = next(r for r in csv.DictReader(handle) if r["compile_mode"] == "default")
    assert float(csv_row["speedup_vs_eager"]) == pytest.approx(2.0)
    assert csv_row["speedup_noise"] == "10 steps"


def test_a_speedup_from_many_separated_steps_is_significant():
    row = compiled_row(pair(50, 0.020, 0.010, 0.001))
    assert row["speedup_noise"] is None
    # the interquartile bands 19.5-20.5 ms and 9.5-10.5 ms: their ratio's extremes
    assert row["speedup_ci_low"] == pytest.approx(19.5 / 10.5)
    assert row["speedup_ci_high"] == pytest.approx(20.5 / 9.5)
    (shown,) = noise_marked([row])
    assert shown["speedup_vs_eager"].startswith("2.000 [")


def test_a_speedup_whose_step_time_bands_overlap_is_noise():
    # 50 steps each, but 20 ms +- 4 ms against 18 ms +- 4 ms
    row = compiled_row(pair(50, 0.020, 0.018, 0.008))
    assert row["speedup_ci_low"] < 1.0 < row["speedup_ci_high"]
    assert row["speedup_noise"] == "interval spans 1.0"


def with_times(record, times_s):
    """``record`` as kiln-train writes it now: with its measured steps' own times."""
    record = json.loads(json.dumps(record))
    times_s = [float(t) for t in times_s]
    ordered = sorted(times_s)
    record["telemetry"].update(
        step_times_s=times_s,
        measured_steps=len(times_s),
        step_time_median_s=float(np.median(times_s)),
        step_time_iqr_s=float(np.percentile(ordered, 75) - np.percentile(ordered, 25)),
    )
    return record


def test_the_interval_is_bootstrapped_from_the_step_times_when_the_summary_has_them():
    # 200 steps each, uniform over 10 ms: medians 20 ms and 18.5 ms. Their interquartile
    # bands overlap (the IQR rule would call it noise), but the medians are well measured.
    rng = np.random.default_rng(0)
    eager_s, compiled_s = rng.uniform(0.015, 0.025, 200), rng.uniform(0.0135, 0.0235, 200)
    eager, compiled = pair(200, 0.020, 0.0185, 0.005)
    bands = compiled_row([eager, compiled])
    assert bands["speedup_noise"] == "interval spans 1.0"  # no step times: IQR bands
    row = compiled_row([with_times(eager, eager_s), with_times(compiled, compiled_s)])
    assert row["speedup_noise"] is None
    assert 1.0 < row["speedup_ci_low"] < row["speedup_vs_eager"] < row["speedup_ci_high"]
    want = np.median(eager_s) / np.median(compiled_s)
    assert row["speedup_vs_eager"] == pytest.approx(want)
    # the same step times, compared with themselves: the interval spans 1.0
    same = compiled_row([with_times(eager, eager_s), with_times(compiled, eager_s[::-1])])
    assert same["speedup_noise"] == "interval spans 1.0"
    # and few of them are noise, whatever their interval
    few = compiled_row([with_times(eager, eager_s[:12]), with_times(compiled, compiled_s[:12])])
    assert few["speedup_noise"] == "12 steps"


def test_scaling_efficiency_from_few_steps_is_noise():
    one = timed(summary(["trainer.devices=1"], "none", 1, 0.020, 400.0, [1.0]), 50, 0.001)
    two = timed(summary(["trainer.devices=2"], "none", 2, 0.025, 600.0, [1.0]), 12, 0.001)
    rows = {r["devices"]: r for r in train_rows([one, two])}
    assert rows[2]["scaling_efficiency"] == pytest.approx(0.75)
    assert rows[2]["scaling_noise"] == "12 steps"
    assert rows[1]["scaling_noise"] is None  # the base itself: 1.0 by definition


def with_flops(record, mfu, device_count):
    record = json.loads(json.dumps(record))
    record["telemetry"].update(
        flops_per_step=3.0e12,
        achieved_flops_per_s=3.0e12 / record["telemetry"]["step_time_median_s"],
        mfu=mfu,
        compile_cache="warm",
    )
    record["machine"]["device_count"] = device_count
    return record


def test_report_shows_flops_achieved_tflops_mfu_and_compile_cache(tmp_path):
    gpu = with_flops(RECORDS[1], 0.412, 1)
    cpu = with_flops(RECORDS[0], None, 0)
    rows = {r["run"]: r for r in train_rows([gpu, cpu])}
    gpu_row, cpu_row = rows[run_name(gpu)], rows[run_name(cpu)]
    assert gpu_row["flops_per_step"] == 3.0e12
    assert gpu_row["achieved_tflops_per_s"] == pytest.approx(
        3.0 / gpu["telemetry"]["step_time_median_s"]
    )
    assert gpu_row["mfu"] == 0.412 and gpu_row["compile_cache"] == "warm"
    assert cpu_row["mfu"] is None and cpu_row["mfu_na"] == "cpu"
    for i, record in enumerate([gpu, cpu]):
        (tmp_path / str(i)).mkdir()
        (tmp_path / str(i) / "summary.json").write_text(json.dumps(record))
    build_report(tmp_path, show=False)
    report = (tmp_path / "report.md").read_text()
    assert "| mfu |" in report and f"{0.412:.1%}" in report and "n/a (cpu)" in report


def packing_run(packing: bool, tokens_per_s: float, padding: float, with_config: bool) -> dict:
    """A causal LM run of a ``data.packing=false,true`` sweep."""
    record = summary([f"data.packing={str(packing).lower()}"], "none", 1, 0.02, 8.0, [1.0])
    record["telemetry"].update(tokens_per_s=tokens_per_s, padding_fraction=padding)
    record["config"] = {"data": {"packing": packing, "max_length": 128}} if with_config else {}
    return record


@pytest.mark.parametrize("with_config", [True, False])
def test_a_packing_sweep_compares_real_tokens_per_second(tmp_path, with_config):
    records = [
        packing_run(False, 1000.0, 0.6, with_config),
        packing_run(True, 2400.0, 0.01, with_config),
        packing_run(True, 2600.0, 0.01, with_config),  # a repeat: pooled by the median
    ]
    rows = train_rows(records)
    ratios = sorted((r["padding_fraction"], r["tokens_vs_unpacked"]) for r in rows)
    assert ratios == [(0.01, pytest.approx(2.5)), (0.01, pytest.approx(2.5)), (0.6, 1.0)]
    for i, record in enumerate(records):
        (tmp_path / str(i)).mkdir()
        (tmp_path / str(i) / "summary.json").write_text(json.dumps(record))
    build_report(tmp_path, show=False)
    with (tmp_path / "train_runs.csv").open() as handle:
        written = list(csv.DictReader(handle))
    assert sorted(float(r["tokens_vs_unpacked"]) for r in written) == [1.0, 2.5, 2.5]


def test_no_packing_ratio_without_an_unpacked_partner():
    rows = train_rows([packing_run(True, 2400.0, 0.01, True), *RECORDS])
    assert all(r["tokens_vs_unpacked"] is None for r in rows)
