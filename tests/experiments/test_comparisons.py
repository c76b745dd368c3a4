"""Comparisons across jobs: every job records its machine, load and calibration; kiln-report
pairs runs by resolved config and never prints a ratio of incomparable runs as a result.

The jobs are real, short kiln-train runs, shared by the tests of this module: an eager job
(logged to W&B) and a compiled job that spells out a default (``data.batch_size=8``); in
make test-all, the eager job again while three busy-loop processes compete for the CPU.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from train_helpers import FAST, explain, run_train

from kiln.experiments.report.cli import build_report
from kiln.experiments.report.train import noise_marked, train_rows
from kiln.experiments.tracking.wandb_files import find_run_file, read_run


def _busy_loops(n: int) -> list[int]:
    """``n`` busy loops that are a neighbour's, not the job's: a job counts its own process
    tree's CPU as its own, and this process is the job (in-process kiln-train), so the loops
    start through a shell that exits and leaves them to init."""
    loop = f'{sys.executable} -c "while True: pass" >/dev/null 2>&1 & echo $!; '
    started = subprocess.run(["sh", "-c", loop * n], capture_output=True, text=True, check=True)
    return [int(pid) for pid in started.stdout.split()]


def _job(log_dir: Path, job_dir: Path, args: list[str], busy: int = 0) -> dict:
    loops = _busy_loops(busy)
    try:
        proc = run_train([*FAST, f"hydra.run.dir={job_dir}", *args], log_dir)
    finally:
        for pid in loops:
            os.kill(pid, signal.SIGKILL)  # init reaps it
    assert proc.returncode == 0, explain(proc)
    return json.loads((job_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """A sweep directory of two real jobs: eager (W&B) and compiled."""
    root = tmp_path_factory.mktemp("comparisons")
    _job(root, root / "sweep" / "0", ["logger=wandb", "compile=none"])
    _job(root, root / "sweep" / "1", ["logger=csv", "compile=default", "data.batch_size=8"])
    return root / "sweep"


@pytest.fixture(scope="module")
def busy(tmp_path_factory, sweep) -> Path:
    """The sweep with its eager job trained again under three busy loops (a neighbour's load:
    they slow every other test that runs meanwhile, so only make test-all has them)."""
    root = tmp_path_factory.mktemp("busy")
    _job(root, root / "sweep" / "0", ["logger=wandb", "compile=none"], busy=3)
    shutil.copytree(sweep / "1", root / "sweep" / "1", symlinks=True)
    return root / "sweep"


def _records(sweep: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(sweep.glob("*/summary.json"))]


def test_every_job_records_its_machine_load_and_calibration(sweep):
    record = _records(sweep)[0]
    machine = record["machine"]
    assert machine["hostname"] and machine["cpu_model"] and machine["affinity_cores"] >= 1
    assert machine["torch"] and machine["gpu_count"] == len(machine["gpu_names"])
    assert "slurm_job_id" in machine and "cudnn" in machine
    for key in ("load_start", "load_end"):
        assert machine[key]["other_cpu_cores"] >= 0 and machine[key]["loadavg_1m"] >= 0
    for key in ("calibration_before", "calibration_after"):
        cal = machine[key]
        assert cal["matmul_gflop_per_s"] > 0 and cal["copy_gb_per_s"] > 0
        assert cal["matmul_dtype"] == "float32" and cal["device"] == "cpu"
        assert cal["seconds"] >= 0  # the calibration records its own cost
    # the W&B run's config holds the same block, with the end-of-job load and calibration
    config = read_run(find_run_file(sweep / "0"))["config"]
    assert config["machine"]["calibration_after"] == machine["calibration_after"]
    assert config["machine"]["load_end"] == machine["load_end"]


def _others(record: dict) -> float:
    """The most cores' worth of CPU other processes used at the job's start or end."""
    machine = record["machine"]
    return max(machine[key]["other_cpu_cores"] for key in ("load_start", "load_end"))


@pytest.mark.long  # three busy loops for a job's length
def test_a_ratio_against_a_job_that_shared_the_cpu_with_busy_loops_is_confounded(busy):
    eager, compiled_record = _records(busy)
    # the three loops are other processes' load, not the job's: over a core's worth of it
    load = _others(eager)
    assert load > 1.0, eager["machine"]
    compiled = next(r for r in train_rows(_records(busy)) if r["compile_mode"] == "default")
    assert compiled["speedup_vs_eager"] is not None
    assert compiled["speedup_verdict"].startswith("confounded: "), compiled["speedup_verdict"]
    report = build_report(busy, show=False)
    printed = noise_marked(report["tables"]["train_runs"][1])
    cell = next(r["speedup_vs_eager"] for r in printed if r["compile_mode"] == "default")
    assert "(confounded: " in cell, cell
    assert "(confounded: " in (busy / "report.md").read_text()
    # the load is the reason, not only the calibration drift it causes: against the same
    # compiled job on a machine nobody else used (the noise of this shared one removed)
    quiet = json.loads(json.dumps(compiled_record))
    for key in ("load_start", "load_end"):
        quiet["machine"][key]["other_cpu_cores"] = 0.0
    row = next(r for r in train_rows([eager, quiet]) if r["compile_mode"] == "default")
    assert f"load 0.0 vs {load:.1f} cores" in row["speedup_verdict"], row["speedup_verdict"]


def _copy(record: dict, **telemetry) -> dict:
    record = json.loads(json.dumps(record))
    record["telemetry"].update(telemetry)
    return record


def test_a_scaling_efficiency_above_one_is_never_a_result(sweep):
    # the eager job and a copy of it "on 2 devices" with 3x its throughput: 1.5 per device
    one = _records(sweep)[0]
    two = _copy(one, samples_per_s=3 * one["telemetry"]["samples_per_s"])
    two["devices"], two["config"]["trainer"]["devices"] = 2, 2
    row = next(r for r in train_rows([one, two]) if r["devices"] == 2)
    assert row["scaling_efficiency"] == pytest.approx(1.5)
    assert row["scaling_verdict"].startswith("confounded: ")
    assert "efficiency 1.50 > 1.05 cannot be true" in row["scaling_verdict"]
    shown = next(r for r in noise_marked(train_rows([one, two])) if r["devices"] == 2)
    assert shown["scaling_efficiency"].startswith("1.5")
    assert "(confounded: " in shown["scaling_efficiency"]


def test_a_summary_without_a_machine_record_is_unverified(sweep):
    records = _records(sweep)
    for record in records:
        record["machine"] = {"device": "cpu", "hostname": "box"}  # as kiln wrote it before
    compiled = next(r for r in noise_marked(train_rows(records)) if r["compile_mode"] != "none")
    assert "(unverified: no machine record)" in compiled["speedup_vs_eager"]


def test_the_eager_partner_is_the_job_whose_resolved_config_differs_only_in_compile(sweep):
    # job 1 spells out data.batch_size=8, which debug=fast already sets: the same config
    records = _records(sweep)
    assert records[1]["overrides"][-1] == "data.batch_size=8"
    compiled = next(r for r in train_rows(records) if r["compile_mode"] == "default")
    assert compiled["speedup_vs_eager"] is not None, compiled["speedup_verdict"]
    assert not (compiled["speedup_verdict"] or "").startswith("unpaired")


def test_an_unpaired_job_says_why(sweep):
    records = _records(sweep)
    records[0]["config"]["data"]["batch_size"] = 4  # the eager job now computes another thing
    compiled = next(r for r in train_rows(records) if r["compile_mode"] == "default")
    assert compiled["speedup_vs_eager"] is None
    assert compiled["speedup_verdict"] == (
        "unpaired: the nearest compile=none run differs in data.batch_size 8 vs 4"
    )
    shown = next(r for r in noise_marked(train_rows(records)) if r["compile_mode"] == "default")
    assert shown["speedup_vs_eager"] == compiled["speedup_verdict"]
