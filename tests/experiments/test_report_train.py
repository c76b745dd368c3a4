"""kiln-report on a training sweep: speedup against eager, scaling efficiency, loss curves."""

import csv
import json

import pytest

from kiln.experiments.report.cli import build_report
from kiln.experiments.report.train import loss_curves, train_rows


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
    from kiln.experiments.job import JobInfo
    from kiln.experiments.report.train import run_name

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
