"""``sweep=strategy`` (ddp, fsdp; with and without activation checkpointing) and kiln-report's
comparison of its runs against plain DDP: throughput (``speedup_vs_ddp``, with the interval
and noise rules of every ratio), what the fit added to memory (``memory_vs_ddp``) and the
per-rank state bytes (``state_vs_ddp``: about 1/2 under FSDP on 2 ranks)."""

from __future__ import annotations

import csv

import pytest
from test_report_train import summary
from train_helpers import FAST, explain, job_dirs, run_train

from kiln.experiments.report.cli import build_report
from kiln.experiments.report.train import train_rows

MIB = 2**20


def strategy_run(strategy: str, ac: bool, step_s: float, rise_mb: float, state_mb: float):
    overrides = [f"trainer.strategy={strategy}", f"trainer.activation_checkpointing={ac}"]
    record = summary(overrides, "none", 2, step_s, 8 / step_s, [1.0])
    record.update(strategy=strategy, activation_checkpointing=ac)
    record["telemetry"].update(
        peak_memory_mb=1000.0 + rise_mb,
        start_memory_mb=1000.0,
        param_bytes=int(state_mb * MIB / 4),
        grad_bytes=int(state_mb * MIB / 4),
        optimizer_state_bytes=int(state_mb * MIB / 2),
    )
    return record


def test_each_run_is_compared_with_plain_ddp():
    records = [
        strategy_run("ddp", False, 0.010, 400.0, 300.0),
        strategy_run("fsdp", False, 0.020, 300.0, 150.0),
        strategy_run("ddp", True, 0.0125, 100.0, 300.0),
        strategy_run("fsdp", True, 0.025, 50.0, 150.0),
    ]
    rows = {(r["strategy"], r["activation_checkpointing"]): r for r in train_rows(records)}
    assert rows[("ddp", False)]["speedup_vs_ddp"] == 1.0
    assert rows[("fsdp", False)]["speedup_vs_ddp"] == pytest.approx(0.5)
    assert rows[("ddp", True)]["speedup_vs_ddp"] == pytest.approx(0.8)
    assert rows[("fsdp", True)]["memory_vs_ddp"] == pytest.approx(50 / 400)
    assert rows[("fsdp", False)]["state_vs_ddp"] == pytest.approx(0.5)
    assert rows[("ddp", True)]["state_vs_ddp"] == pytest.approx(1.0)
    assert rows[("fsdp", False)]["strategy_noise"] == "steps not recorded"  # never bare
    assert rows[("ddp", False)]["state_mb"] == pytest.approx(300.0, abs=1e-3)


def test_auto_on_several_devices_is_the_ddp_base_and_a_lone_run_is_not_compared():
    base = strategy_run("auto", False, 0.010, 400.0, 300.0)
    lone = {**summary(["compile=none"], "none", 1, 0.010, 800.0, [1.0]), "strategy": "auto"}
    rows = train_rows([base, strategy_run("fsdp", False, 0.010, 200.0, 150.0), lone])
    by_strategy = {r["strategy"]: r for r in rows}
    assert by_strategy["ddp"]["state_vs_ddp"] == 1.0  # auto on 2 devices is DDP
    assert by_strategy["fsdp"]["state_vs_ddp"] == pytest.approx(0.5)
    assert by_strategy["single"]["speedup_vs_ddp"] is None  # one device: no DDP partner


@pytest.mark.process  # 4 jobs of 2 gloo processes each
def test_a_tiny_strategy_sweep_and_its_report(tmp_path):
    proc = run_train(
        ["-m", "sweep=strategy", *FAST, "trainer.max_steps=3", "trainer.accelerator=cpu"],
        tmp_path,
        timeout=1500,
        process=True,
    )
    assert proc.returncode == 0, explain(proc)
    dirs = job_dirs(tmp_path)
    assert len(dirs) == 4
    report = build_report(dirs[0].parent, show=False)
    with (dirs[0].parent / "train_runs.csv").open() as handle:
        rows = {(r["strategy"], r["activation_checkpointing"]): r for r in csv.DictReader(handle)}
    assert set(rows) == {(s, a) for s in ("ddp", "fsdp") for a in ("False", "True")}
    assert float(rows[("ddp", "False")]["speedup_vs_ddp"]) == 1.0
    for key, row in rows.items():
        assert float(row["peak_memory_mb"]) > 0 and float(row["samples_per_s"]) > 0, key
        assert row["speedup_vs_ddp"] and row["memory_vs_ddp"], key  # every run compared
    # FSDP on 2 ranks holds about half of DDP's per-rank state (padding of odd dims aside)
    for ac in ("False", "True"):
        assert 0.45 < float(rows[("fsdp", ac)]["state_vs_ddp"]) < 0.55
        assert float(rows[("ddp", ac)]["state_vs_ddp"]) == 1.0
    assert "speedup_vs_ddp" in (dirs[0].parent / "report.md").read_text()
    assert report["records"]
