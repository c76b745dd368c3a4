"""A job's record survives a deleted checkpoint and a lost W&B row: a resume falls back to
the newest checkpoint still there and says so, a finished job re-run with a checkpoint gone
says so, a record is never overwritten with less than it held, and a W&B run gets every
training and validation row once (reconciled by what its files hold, each kind apart)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from train_helpers import FAST, explain, run_train, summary

from kiln.experiments.tracking.wandb_files import read_history

# checkpoints at steps 2, 4, 6; keep_last_k=3 keeps them all
ARGS = [
    *FAST,
    "trainer.max_steps=6",
    "trainer.checkpoint_every_n_steps=2",
    "trainer.keep_last_k=3",
    "trainer.deterministic=true",
]
WIDE = {"COLUMNS": "500"}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    log_dir = tmp_path_factory.mktemp("records")
    job_dir = log_dir / "J"
    proc = run_train([*ARGS, f"hydra.run.dir={job_dir}"], log_dir)
    assert proc.returncode == 0, explain(proc)
    return job_dir


def _copy_without_newest(finished: Path, tmp_path: Path) -> Path:
    job_dir = tmp_path / "job"
    shutil.copytree(finished, job_dir, symlinks=True)
    shutil.rmtree(job_dir / "checkpoints" / "step-00000006.ckpt")
    return job_dir


def test_a_deleted_newest_checkpoint_falls_back_to_the_newest_one_left(finished, tmp_path):
    job_dir = _copy_without_newest(finished, tmp_path)
    ckpt = job_dir / "checkpoints"
    proc = run_train([*ARGS, "trainer.max_steps=8", f"hydra.run.dir={job_dir}"], tmp_path, env=WIDE)
    assert proc.returncode == 0, explain(proc)
    output = proc.stdout + proc.stderr
    assert f"{ckpt / 'step-00000006.ckpt'} is missing" in output, explain(proc)
    assert f"resumed from {ckpt / 'step-00000004.ckpt'} at step 4" in output, explain(proc)
    record = summary(job_dir)
    assert record["status"] == "ok" and record["global_step"] == 8
    assert [a["from_step"] for a in record["attempts"]] == [0, 4]
    assert [row["step"] for row in record["history"]] == list(range(1, 9))
    listed = list(json.loads((ckpt / "run.json").read_text())["checkpoints"])
    assert listed == ["step-00000004.ckpt", "step-00000006.ckpt", "step-00000008.ckpt"]
    trained = sorted(r["trainer/global_step"] for r in read_history(job_dir) if "train/loss" in r)
    assert trained == list(range(1, 9))  # each step once in the W&B run


def test_a_finished_job_rerun_with_its_last_checkpoint_gone_says_so(tmp_path):
    job_dir = tmp_path / "job"  # in place: a copy's paths make another config
    proc = run_train([*ARGS, f"hydra.run.dir={job_dir}"], tmp_path)
    assert proc.returncode == 0, explain(proc)
    shutil.rmtree(job_dir / "checkpoints" / "step-00000006.ckpt")
    before = summary(job_dir)
    proc = run_train([*ARGS, f"hydra.run.dir={job_dir}"], tmp_path, env=WIDE)
    assert proc.returncode == 0, explain(proc)
    output = proc.stdout + proc.stderr
    missing = job_dir / "checkpoints" / "step-00000006.ckpt"
    assert f"{missing} is missing" in output, explain(proc)
    assert "newest intact checkpoint is step 4" in output, explain(proc)
    after = summary(job_dir)
    assert {k: v for k, v in after.items() if k != "attempts"} == {
        k: v for k, v in before.items() if k != "attempts"
    }


def test_an_attempt_that_fails_before_its_first_step_keeps_what_the_record_held(
    finished, tmp_path, monkeypatch
):
    job_dir = tmp_path / "job"
    shutil.copytree(finished, job_dir, symlinks=True)
    before = summary(job_dir)

    def broken_fit(*args, **kwargs):
        raise RuntimeError("the resume failed before its first step")

    monkeypatch.setattr("kiln.core.fit", broken_fit)
    proc = run_train([*ARGS, "trainer.max_steps=8", f"hydra.run.dir={job_dir}"], tmp_path)
    assert proc.returncode == 1, explain(proc)
    after = summary(job_dir)
    assert after["status"] == "failed" and after["error_stage"] == "train"
    assert "the resume failed before its first step" in after["error"]
    for key in ("global_step", "history", "validation_history", "metrics", "telemetry"):
        assert after[key] == before[key], key
    assert [a["ended"] for a in after["attempts"]] == ["ok", "failed"]


def test_a_validation_row_wandb_lacks_is_sent_though_it_holds_that_steps_training_row(
    tmp_path, monkeypatch
):
    """What a SIGKILL during the step-9 save left: step 8's training row in the W&B run, its
    validation row not (made certain here by dropping it; the kill's timing is luck)."""
    from kiln.experiments.tracking.wandb_logger import KilnWandbLogger

    args = [*FAST, "trainer.val_every_n_steps=4", "trainer.checkpoint_every_n_steps=4"]
    job_dir = tmp_path / "job"
    log_metrics = KilnWandbLogger.log_metrics

    def lose_step_8_validation(self, metrics, step=None):
        if step == 8 and any(k.startswith("val/") for k in metrics):
            return
        log_metrics(self, metrics, step)

    monkeypatch.setattr(KilnWandbLogger, "log_metrics", lose_step_8_validation)
    first = run_train([*args, "trainer.max_steps=8", f"hydra.run.dir={job_dir}"], tmp_path)
    assert first.returncode == 0, explain(first)
    monkeypatch.undo()
    resumed = run_train([*args, "trainer.max_steps=12", f"hydra.run.dir={job_dir}"], tmp_path)
    assert resumed.returncode == 0, explain(resumed)
    rows = read_history(job_dir)
    assert sorted(r["trainer/global_step"] for r in rows if "val/accuracy" in r) == [4, 8, 12]
    assert sorted(r["trainer/global_step"] for r in rows if "train/loss" in r) == list(range(1, 13))
