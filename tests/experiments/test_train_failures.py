"""Failures say what happened, once: every job leaves a summary.json with a one-line reason,
shows in the sweep table and in kiln-report, and config errors fail before W&B opens a run."""

from __future__ import annotations

import subprocess
import sys

import pytest
from train_helpers import FAST, compose_train, explain, job_dirs, run_train, summary

from kiln.core import FitResult
from kiln.core.distributed.launch import WorkerFailedError
from kiln.experiments.jobs.lifecycle import one_line_reason
from kiln.experiments.report.cli import build_report
from kiln.experiments.train.train_config import validate
from kiln.experiments.train.train_job import fit_progress


def test_unresolvable_config_in_a_sweep_leaves_a_summary_a_table_row_and_a_report_row(tmp_path):
    proc = run_train(
        ["-m", *FAST, "trainer.max_steps=1", "data.seed=${oc.env:KILN_NOPE},0"], tmp_path
    )
    assert proc.returncode == 1, explain(proc)
    bad_dir, ok_dir = job_dirs(tmp_path)
    bad = summary(bad_dir)
    assert bad["status"] == "failed" and bad["error_stage"] == "config"
    assert "KILN_NOPE" in bad["error"] and "\n" not in bad["error"]
    assert bad["model"] == "minilm-cls" and bad["seed"] == 0  # what did resolve is recorded
    assert not (bad_dir / "wandb").exists()  # no W&B run for a config that cannot run
    assert "Traceback" in (bad_dir / "error.log").read_text()
    assert summary(ok_dir)["status"] == "ok"
    assert "1 of 2 jobs failed: 0" in proc.stderr
    assert "KILN_NOPE" in proc.stdout  # the end-of-sweep table shows the reason

    report = build_report(bad_dir.parent, tmp_path / "report", show=False)
    columns, rows = report["tables"]["train_runs"]
    assert "error" in columns and len(rows) == 2
    assert any(r["status"] == "failed" and "KILN_NOPE" in r["error"] for r in rows)


@pytest.mark.parametrize("lr", ["nan", "1e39", "-1"])
def test_bad_learning_rate_fails_validation_naming_the_key(lr):
    cfg = compose_train([f"optimizer.lr={lr}"])
    cfg.paths.output_dir = "/tmp/kiln-compose-test"
    with pytest.raises(ValueError, match=r"optimizer.lr=.* is not valid; it must be a finite"):
        validate(cfg)


@pytest.mark.parametrize("norm", ["nan", "inf", "-1.0", "0"])
def test_bad_gradient_clip_norm_fails_validation_naming_the_key(norm):
    """``nan <= 0`` is False: a NaN, infinite or non-positive clip norm must fail in the
    config stage, not steps later as NonFiniteGradientError."""
    cfg = compose_train([f"trainer.gradient_clip_norm={norm}"])
    cfg.paths.output_dir = "/tmp/kiln-compose-test"
    with pytest.raises(
        ValueError,
        match=r"trainer.gradient_clip_norm=.* is not valid; use a finite positive number, or "
        "null to disable clipping",
    ):
        validate(cfg)


def test_a_negative_label_fails_before_training_naming_file_column_and_line(tmp_path):
    """A bad label fails before training (not mid-training, as torch's ``IndexError``)."""
    data = tmp_path / "reviews.csv"
    data.write_text("text,label\n" + "good film,1\nbad film,0\n" * 8 + "awful,-1\n")
    proc = run_train(
        [*FAST, "model=bert-tiny-cls", f"data.dataset={data}", "data.batch_size=4"], tmp_path
    )
    assert proc.returncode == 1, explain(proc)
    (job_dir,) = job_dirs(tmp_path)
    record = summary(job_dir)
    said = f"ValueError: dataset file '{data}', column 'label': line 18 (row 16) has label -1; "
    assert record["error"] == said + "labels are class indices (integers >= 0) or class names"
    assert record["global_step"] == 0 and record["history"] == []


def test_a_config_error_is_printed_once_and_opens_no_wandb_run(tmp_path):
    proc = run_train([*FAST, "optimizer.lr=nan"], tmp_path, timeout=300)
    assert proc.returncode == 1, explain(proc)
    output = proc.stdout + proc.stderr
    assert output.count("optimizer.lr=nan is not valid") == 1, explain(proc)
    assert "Traceback" not in output, explain(proc)
    (job_dir,) = job_dirs(tmp_path)
    assert summary(job_dir)["error_stage"] == "config"
    assert not (job_dir / "wandb").exists()


def test_a_bad_model_name_fails_before_worker_processes_start(tmp_path):
    proc = run_train([*FAST, "model.name=bert-tiny", "trainer.devices=2"], tmp_path, timeout=300)
    assert proc.returncode == 1, explain(proc)
    (job_dir,) = job_dirs(tmp_path)
    record = summary(job_dir)
    assert record["error_stage"] == "config" and "unknown model 'bert-tiny'" in record["error"]
    assert "worker rank" not in record["error"]


def test_documented_data_options_need_no_plus():
    cfg = compose_train(["data.dataset=kiln/sentiment", "data.label_column=label"])
    assert cfg.data.dataset == "kiln/sentiment" and cfg.data.label_column == "label"
    cfg = compose_train(["data=digits", "data.label_column=target", "data.augment=true"])
    assert cfg.data.label_column == "target" and cfg.data.augment is True


def test_cfg_job_resolve_prints_the_config(tmp_path):
    cmd = [sys.executable, "-m", "kiln.experiments.train", "--cfg", "job", "--resolve"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, explain(proc)
    assert "output_dir: null" in proc.stdout and "minilm-cls" in proc.stdout


def test_a_worker_failure_is_one_line_naming_the_exception_and_the_rank():
    trace = "\n".join(
        ["Traceback (most recent call last):"]
        + [f'  File "x.py", line {i}, in f\n    g()' for i in range(30)]
        + ["ValueError: shapes (8, 3) and (4, 3) do not match"]
    )
    exc = WorkerFailedError(f"worker rank 1 of the launched job failed:\n{trace}")
    reason = one_line_reason(exc)
    assert reason == (
        "ValueError: shapes (8, 3) and (4, 3) do not match "
        "(in worker rank 1 of the launched job failed)"
    )
    assert one_line_reason(KeyError("x")) == "KeyError: 'x'"


def test_a_lost_peer_is_named_by_its_host():
    """gloo names a dead peer by address only; a multi-node job's record names the node."""
    exc = RuntimeError(
        "[gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:27286. This is "
        "typically caused by a remote worker crashing."
    )
    assert "Connection closed by peer [127.0.0.1]:27286 (localhost). This" in one_line_reason(exc)
    reset = RuntimeError("[pair.cc:545] Read error [127.0.0.1]:38559: Connection reset by peer.")
    assert "Read error [127.0.0.1]:38559 (localhost): Connection reset" in one_line_reason(reset)
    unnamed = RuntimeError("Connection closed by peer [192.0.2.123]:1")  # no name: left as is
    assert one_line_reason(unnamed) == "RuntimeError: Connection closed by peer [192.0.2.123]:1"


def test_a_failed_fit_keeps_its_progress():
    exc = RuntimeError("loss is nan at step 3")
    validated = [{"step": 2, "val/accuracy": 0.5}]
    exc.kiln_result = FitResult(
        global_step=2, epoch=0, history=[{"step": 1}, {"step": 2}], validation_history=validated
    )
    assert fit_progress(exc) == {
        "global_step": 2,
        "history": [{"step": 1}, {"step": 2}],
        "validation_history": validated,
    }
    assert fit_progress(RuntimeError("no progress")) == {}
