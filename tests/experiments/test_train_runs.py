"""kiln-train end to end on the tiny BERT: single runs, sweeps, failures, worker processes,
the submitit launcher, and what lands in W&B (read back from the offline .wandb files)."""

from __future__ import annotations

import csv

import pytest
from train_helpers import FAST, explain, job_dirs, run_train, summary

from kiln.experiments.tracking import wandb_files


def wandb_run_dirs(job_dir):
    return sorted((job_dir / "wandb").glob("offline-run-*"))


def assert_wandb_holds_every_logged_row(job_dir, record):
    """One W&B run in the job's directory, holding every logged row exactly once: each
    training row of the job's history, the validation metrics and the telemetry."""
    runs = wandb_run_dirs(job_dir)
    assert len(runs) == 1, runs
    assert record["wandb"]["dir"] == str(runs[0].relative_to(job_dir))
    history = wandb_files.read_history(runs[0])
    train_rows = [r for r in history if "train/loss" in r]
    assert [r["trainer/global_step"] for r in train_rows] == [r["step"] for r in record["history"]]
    for logged, row in zip(train_rows, record["history"], strict=True):
        assert logged["train/loss"] == pytest.approx(row["train/loss"])
    val_rows = [r for r in history if any(k.startswith("val/") for k in r)]
    assert val_rows, "no validation row in W&B"
    for key, value in record["metrics"].items():
        assert val_rows[-1][key] == pytest.approx(value)
    # the telemetry is in the summary, not in a one-point history row
    assert not [r for r in history if "telemetry/compile_time_s" in r]
    return wandb_files.read_run(runs[0])


def test_single_run_writes_summary_and_one_offline_wandb_run(tmp_path):
    proc = run_train([*FAST, "precision=bf16-mixed"], tmp_path)
    assert proc.returncode == 0, explain(proc)
    (job_dir,) = job_dirs(tmp_path)
    record = summary(job_dir)
    assert record["kind"] == "train" and record["status"] == "ok" and record["error"] is None
    assert record["global_step"] == 4 and record["precision"] == "bf16-mixed"
    assert "val/accuracy" in record["metrics"] and record["train_loss"] is not None
    assert {"compile_time_s", "recompiles", "step_time_median_s"} <= set(record["telemetry"])
    assert record["config"]["trainer"]["max_steps"] == 4
    assert record["machine"]["device"] == "cpu"

    run = assert_wandb_holds_every_logged_row(job_dir, record)
    assert run["exit_code"] == 0 and run["job_type"] == "train"
    tags = {"model:minilm-cls", "tiny", "precision:bf16-mixed", "compile:none", "devices:1"}
    assert tags <= set(run["tags"])
    assert record["model"] == "minilm-cls" and record["model_tiny"] is True
    assert run["config"]["trainer"]["max_steps"] == 4  # the resolved config
    assert run["name"] == ",".join([*FAST, "precision=bf16-mixed"])
    wb_summary = wandb_files.read_summary(wandb_run_dirs(job_dir)[0])
    assert wb_summary["status"] == "ok"
    assert record["stop_reason"] == wb_summary["stop_reason"] == "max_steps"
    assert wb_summary["val/accuracy"] == pytest.approx(record["metrics"]["val/accuracy"])
    assert "telemetry/compile_time_s" in wb_summary
    assert "kiln-train" in proc.stdout and "val/accuracy" in proc.stdout  # the final table
    # everything stays in the job directory (hydra.job.chdir=False writes nothing to cwd)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


def test_an_early_stopped_run_says_why_in_its_summary_table_and_wandb_run(tmp_path):
    """The issue's reproduction: it stopped at step 2 of 6 and the record only said
    ``status: ok, global_step: 2``."""
    stop = [
        "model=bert-tiny-cls",
        "debug=fast",
        "callbacks=[ema,early_stopping]",
        "callbacks.early_stopping.patience=1",
        "callbacks.early_stopping.monitor=val/accuracy",
        "callbacks.early_stopping.mode=max",
        "trainer.val_every_n_steps=1",
        "compile.backend=aot_eager",
    ]
    proc = run_train(stop, tmp_path)
    assert proc.returncode == 0, explain(proc)
    (job_dir,) = job_dirs(tmp_path)
    record = summary(job_dir)
    assert record["status"] == "ok" and record["global_step"] < 6
    reason = record["stop_reason"]
    assert reason.startswith("EarlyStopping: val/accuracy did not improve"), reason
    assert record["stop_signal"] is None
    wb_summary = wandb_files.read_summary(wandb_run_dirs(job_dir)[0])
    assert (wb_summary["stop_reason"], wb_summary["stop_signal"]) == (reason, None)
    table = " ".join(proc.stdout.split())  # the end-of-run table, its wrapped cells joined
    assert "stopped by" in table and "EarlyStopping: val/accuracy did not" in table, proc.stdout


def test_sweep_goes_on_after_a_failed_job_and_exits_nonzero(tmp_path):
    # job 0 diverges to a NaN loss, job 1 trains
    proc = run_train(
        ["-m", *FAST, "trainer.gradient_clip_norm=null", "optimizer.lr=1e30,1e-3"], tmp_path
    )
    assert proc.returncode == 1, explain(proc)
    assert "1 of 2 jobs failed" in proc.stderr
    failed_dir, ok_dir = job_dirs(tmp_path)
    failed, ok = summary(failed_dir), summary(ok_dir)
    assert failed["status"] == "failed" and "NonFiniteLossError" in failed["error"]
    # the failed job still records the steps it completed (fit attaches them to its error)
    steps = [row["step"] for row in failed["history"]]
    assert failed["global_step"] >= 1 and steps == list(range(1, len(steps) + 1)) and steps
    assert ok["status"] == "ok" and ok["global_step"] == 4
    assert failed["sweep_dir"] == ok["sweep_dir"] == str(failed_dir.parent)
    assert float(failed["overrides"][-1].split("=")[1]) == 1e30  # Hydra writes 1e+30

    failed_run = wandb_files.read_run(wandb_run_dirs(failed_dir)[0])
    assert failed_run["exit_code"] == 1  # marked failed ...
    assert "NonFiniteLossError" in wandb_files.read_summary(wandb_run_dirs(failed_dir)[0])["error"]
    ok_run = assert_wandb_holds_every_logged_row(ok_dir, ok)  # ... and never two jobs in one run
    assert ok_run["id"] != failed_run["id"]
    assert ok_run["group"] == failed_run["group"] != ""


def test_csv_and_no_logger(tmp_path):
    proc = run_train(["-m", *FAST, "logger=csv,none"], tmp_path)
    assert proc.returncode == 0, explain(proc)
    csv_dir, none_dir = job_dirs(tmp_path)
    with open(csv_dir / "csv" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows if r.get("train/loss")] == [1, 2, 3, 4]
    assert summary(csv_dir)["wandb"] is None and not (csv_dir / "wandb").exists()
    assert summary(none_dir)["status"] == "ok"
    assert not (none_dir / "wandb").exists() and not (none_dir / "csv").exists()


@pytest.mark.slow
def test_two_worker_processes_per_job_inside_a_multirun(tmp_path):
    """trainer.devices=2: each job starts 2 gloo processes itself; rank 0 alone logs."""
    proc = run_train(
        ["-m", *FAST, "trainer.max_steps=3", "trainer.devices=2", "precision=32-true,bf16-mixed"],
        tmp_path,
        timeout=900,
        process=True,
    )
    assert proc.returncode == 0, explain(proc)
    dirs = job_dirs(tmp_path)
    assert [d.name for d in dirs] == ["0", "1"]
    for job_dir, precision in zip(dirs, ("32-true", "bf16-mixed"), strict=True):
        record = summary(job_dir)
        assert record["status"] == "ok" and record["devices"] == 2
        assert record["precision"] == precision and record["output_dir"] == str(job_dir)
        run = assert_wandb_holds_every_logged_row(job_dir, record)  # logged once, not per rank
        assert "devices:2" in run["tags"]


@pytest.mark.slow
def test_submitit_local_launcher_runs_a_two_job_sweep(tmp_path):
    proc = run_train(
        ["-m", "launcher=local_submitit", *FAST, "compile=none,default"],
        tmp_path,
        timeout=900,
        process=True,
    )
    assert proc.returncode == 0, explain(proc)
    dirs = job_dirs(tmp_path)
    assert len(dirs) == 2
    records = [summary(d) for d in dirs]
    assert [r["compile_mode"] for r in records] == ["none", "default"]
    for job_dir, record in zip(dirs, records, strict=True):
        assert record["status"] == "ok", record["error"]
        assert_wandb_holds_every_logged_row(job_dir, record)
    assert list((dirs[0].parent / ".submitit").iterdir())  # submitit ran them
