"""What a W&B user gets from a kiln-train sweep, read back from its offline runs: each job's
summary (telemetry, machine, total time, recompile reasons), config (Hydra's choices and the
job's overrides), one ``model:`` tag, the sweep's group; and ``kiln-report --wandb``'s one
report run per sweep, with a table of every job's ratio, interval and flag."""

from __future__ import annotations

import json

import pytest
from train_helpers import FAST, explain, job_dirs, run_train, summary

from kiln.experiments.report.cli import main as report_main
from kiln.experiments.tracking import wandb_files


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """An eager and a compiled job (validation in eval mode recompiles the compiled one)."""
    log_dir = tmp_path_factory.mktemp("wandb_sweep")
    proc = run_train(["-m", *FAST, "compile=none,default"], log_dir)
    assert proc.returncode == 0, explain(proc)
    return job_dirs(log_dir)


def test_each_job_run_holds_what_a_comparison_needs(sweep):
    for job, mode in zip(sweep, ("none", "default"), strict=True):
        record = summary(job)
        run = wandb_files.read_run(job)
        # the config: the resolved config plus Hydra's group choices and the job's overrides
        assert run["config"]["hydra"]["choices"]["compile"] == mode
        assert run["config"]["hydra"]["choices"]["model"] == "minilm-cls"
        assert run["config"]["hydra"]["overrides"] == record["overrides"]
        assert f"compile={mode}" in record["overrides"]
        # one model: tag (the tiny variant is a tag of its own)
        assert [t for t in run["tags"] if t.startswith("model:")] == ["model:minilm-cls"]
        assert "tiny" in run["tags"]
        # the group is what packages/experiments/README.md says: <sweep name or train>/<dir>
        assert run["group"] == record["wandb"]["group"] == f"train/{job.parent.name}"
        # whole-run figures are in the summary, never one-point history rows
        history = wandb_files.read_history(job)
        assert not [k for row in history for k in row if k.startswith("telemetry/")]
        wb = wandb_files.read_summary(job)
        tel = record["telemetry"]
        assert wb["telemetry/total_time_s"] == pytest.approx(tel["total_time_s"])
        assert tel["total_time_s"] > tel["compile_time_s"] + tel["step_time_median_s"]
        # every block of the record reaches the summary (machine, and any added later)
        assert wb["machine/hostname"] == record["machine"]["hostname"]
        assert wb["telemetry/recompile_reasons"] == tel["recompile_reasons"]
    compiled = summary(sweep[1])["telemetry"]
    assert compiled["compile_time_s"] > 0 and compiled["recompiles"] >= 1
    # dynamo's guard failure says why it recompiled
    assert len(compiled["recompile_reasons"]) == min(compiled["recompiles"], 5)
    assert all(": " in reason and reason.strip() for reason in compiled["recompile_reasons"])
    assert summary(sweep[0])["telemetry"]["recompile_reasons"] == []


def test_kiln_report_wandb_keeps_one_run_per_sweep_with_a_comparison_table(sweep):
    root = sweep[0].parent
    for _ in range(2):
        assert report_main([str(root), "--wandb", "--quiet"]) == 0
    files = wandb_files.find_run_files(root / "report")  # both calls: one run
    assert len(files) == 2
    run = wandb_files.read_run(root / "report")
    assert run["name"] == "report" and run["group"] == f"train/{root.name}"
    tables = sorted(files[-1].parent.glob("files/media/table/comparisons_*.table.json"))
    assert tables, list(files[-1].parent.rglob("*"))
    table = json.loads(tables[-1].read_text())
    rows = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
    speedups = {r["compile_mode"]: r for r in rows if r["ratio"] == "speedup"}
    assert set(speedups) == {"none", "default"}
    compiled = speedups["default"]
    assert compiled["value"] > 0 and compiled["ci_low"] <= compiled["ci_high"]
    assert compiled["flag"].startswith("noise: ")  # 3 measured steps: never a bare result


def test_a_rerun_waits_for_the_attempt_before_to_let_go_of_the_run(tmp_path):
    """W&B's service holds a killed attempt's run a few seconds after its process died; a
    job re-run into its directory at once waits for it instead of failing ("run ID ... is
    in use")."""
    import threading

    from kiln.experiments.settings.base import LoggerConfig
    from kiln.experiments.settings.job_info import JobInfo
    from kiln.experiments.tracking.tracker import Tracker

    job = JobInfo(output_dir=str(tmp_path))
    before = Tracker(LoggerConfig(), job, resume=True).start()
    threading.Timer(2.0, before.finish).start()  # lets go of the run while the next waits
    with Tracker(LoggerConfig(), job, resume=True) as again:
        assert again.run.id == before.run.id
