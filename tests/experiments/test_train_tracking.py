"""The W&B tracker, job identity, job JSON files and the end-of-sweep check, in-process."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

from kiln.experiments.jobs.hydra_callbacks import SweepStatus
from kiln.experiments.jobs.sweep_scan import scan_sweep
from kiln.experiments.settings.base import LoggerConfig
from kiln.experiments.settings.job_files import write_job_json
from kiln.experiments.settings.job_info import JobInfo
from kiln.experiments.tracking import wandb_files
from kiln.experiments.tracking.tracker import Tracker


def test_write_job_json_is_strict_json(tmp_path):
    path = write_job_json(
        tmp_path / "job" / "summary.json",
        {"loss": torch.tensor(0.5), "nan": math.nan, "steps": [1, 2], "nested": {"x": 1}},
    )
    assert json.loads(path.read_text()) == {
        "loss": 0.5,
        "nan": None,
        "steps": [1, 2],
        "nested": {"x": 1},
    }
    assert not list(path.parent.glob("*.tmp"))


def test_run_name_and_group_come_from_the_job():
    job = JobInfo(
        output_dir="/x/3",
        overrides=[
            "precision=bf16-mixed",
            "compile=default",
            "logger.mode=online",
            "hydra.launcher.timeout_min=5",
            "launcher=slurm",
        ],
        sweep_dir="/runs/multirun/2025-01-01_00-00-00",
        sweep_name="precision_compile",
        job_num=3,
    )
    assert job.run_name == "precision=bf16-mixed,compile=default"
    assert job.group == "precision_compile/2025-01-01_00-00-00"
    single = JobInfo(output_dir="/x", choices={"experiment": "vit_digits"})
    assert single.run_name == "vit_digits" and single.group is None


def test_bad_logger_values_say_what_is_valid():
    with pytest.raises(ValueError, match=r"logger.backend='tensorboard' is not valid; choose"):
        LoggerConfig(backend="tensorboard")
    with pytest.raises(ValueError, match=r"logger.mode='dryrun' is not valid; choose"):
        LoggerConfig(mode="dryrun")


def _read_finished_run(path, timeout: float = 60.0) -> dict:
    """The run once its exit record is on disk. ``run.finish()`` returns when W&B's service
    has the exit record; the service closes the run's file after that, on its own, so a
    reader in the same process can be ahead of it (a process that exits waits for it)."""
    deadline = time.monotonic() + timeout
    while "exit_code" not in (run := wandb_files.read_run(path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return run


def test_tracker_marks_the_run_failed_with_the_reason_and_finishes_once(tmp_path):
    job = JobInfo(output_dir=str(tmp_path), overrides=["trainer.max_steps=3"])
    with (
        pytest.raises(RuntimeError, match="boom"),
        Tracker(
            LoggerConfig(), job, config={"trainer": {"max_steps": 3}}, tags=["model:x"]
        ) as tracker,
    ):
        for step in (1, 2):
            tracker.loggers[0].log_metrics({"train/loss": 1.0 / step}, step=step)
        raise RuntimeError("boom")
    assert tracker.finished
    assert tracker.info["project"] == "kiln" and tracker.info["group"] is None  # no sweep
    tracker.finish("ok")  # a second finish changes nothing
    run = _read_finished_run(tmp_path)
    assert run["exit_code"] == 1 and run["name"] == "trainer.max_steps=3"
    assert run["tags"] == ["model:x"] and run["config"]["trainer"] == {"max_steps": 3}
    summary = wandb_files.read_summary(tmp_path)
    assert summary["status"] == "failed" and summary["error"] == "RuntimeError: boom"
    history = wandb_files.read_history(tmp_path)
    assert [(r["trainer/global_step"], r["train/loss"]) for r in history] == [(1, 1.0), (2, 0.5)]


def test_no_logger_means_no_run(tmp_path):
    with Tracker(LoggerConfig(backend="none"), JobInfo(output_dir=str(tmp_path))) as tracker:
        assert tracker.loggers == [] and tracker.info is None
    assert not any(tmp_path.iterdir())


def _job(sweep, name, record):
    (sweep / name / ".hydra").mkdir(parents=True)
    (sweep / name / ".hydra" / "config.yaml").write_text("{}")
    if record is not None:
        write_job_json(sweep / name / "summary.json", record)


def test_sweep_status_exits_nonzero_when_a_job_failed_or_left_nothing(tmp_path, capsys):
    from omegaconf import OmegaConf

    _job(tmp_path, "0", {"status": "ok", "overrides": ["a=1"], "metrics": {"val/acc": 1.0}})
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    SweepStatus().on_multirun_end(config)  # all good: returns
    _job(tmp_path, "1", {"status": "failed", "overrides": ["a=2"], "error": "NonFiniteLossError"})
    _job(tmp_path, "2", None)
    _job(tmp_path, "10", {"status": "ok", "overrides": ["a=11"]})
    assert [job.name for job in scan_sweep(tmp_path)] == ["0", "1", "2", "10"]
    with pytest.raises(SystemExit) as info:
        SweepStatus().on_multirun_end(config)
    assert info.value.code == 1
    assert "2 of 4 jobs failed: 1, 2" in capsys.readouterr().err


def test_report_takes_group_and_project_from_the_records_wandb_entry(tmp_path):
    from kiln.experiments.report.wandb_run import sweep_group

    records = [{"wandb": None}, {"wandb": {"group": "bench/2025", "project": "p"}}]
    assert sweep_group(records, tmp_path) == ("bench/2025", "p")
    assert sweep_group([{"job_name": "bench"}], tmp_path) == (f"bench/{tmp_path.name}", None)


@pytest.mark.slow
def test_flops_mfu_and_compile_cache_reach_the_wandb_summary(tmp_path):
    from kiln.experiments.train.train_job import _wandb_summary

    telemetry = {
        "flops_per_step": 6.0e11,
        "achieved_flops_per_s": 3.0e13,
        "mfu": None,  # the CPU: no peak
        "compile_cache": "warm",
        "measured_steps": 36,
    }
    record = {
        "metrics": {"val/accuracy": 0.75},
        "telemetry": telemetry,
        "global_step": 40,
        "train_loss": 0.5,
        "seed": 0,
        "init_weights_sha256": "ab",
    }
    with Tracker(LoggerConfig(), JobInfo(output_dir=str(tmp_path))) as tracker:
        tracker.summarize(_wandb_summary(record))
    _read_finished_run(tmp_path)
    summary = wandb_files.read_summary(tmp_path)
    assert {k: summary.get(f"telemetry/{k}") for k in telemetry} == telemetry
