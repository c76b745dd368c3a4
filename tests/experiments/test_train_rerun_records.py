"""A finished job's record survives what a re-run into its directory can do:
fewer steps are refused in the config stage, an attempt with nothing to train changes no
figure, a damaged newest checkpoint is taken out of the run (the attempt records the step it
really started from, retention keeps the intact one), and resume inputs that name no
checkpoint say what to pass."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from checkpoint_files import flip_a_byte
from train_helpers import FAST, explain, run_train, summary

# 7 steps: checkpoints at steps 2, 4, 6 and the last, 7; keep_last_k=3 keeps 4, 6, 7
ARGS = [
    *FAST,
    "trainer.max_steps=7",
    "trainer.checkpoint_every_n_steps=2",
    "trainer.keep_last_k=3",
]
WIDE = {"COLUMNS": "500"}  # the end-of-run table keeps each error on one line


def _listed(job_dir: Path) -> list[str]:
    return list(json.loads((job_dir / "checkpoints" / "run.json").read_text())["checkpoints"])


def _tree(directory: Path) -> dict[str, bytes]:
    """Every file below ``directory`` with its bytes."""
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    log_dir = tmp_path_factory.mktemp("rerun")
    job_dir = log_dir / "J"
    proc = run_train([*ARGS, f"hydra.run.dir={job_dir}"], log_dir)
    assert proc.returncode == 0, explain(proc)
    assert _listed(job_dir) == ["step-00000004.ckpt", "step-00000006.ckpt", "step-00000007.ckpt"]
    return job_dir


def _copy(finished: Path, tmp_path: Path) -> Path:
    job_dir = tmp_path / "job"
    shutil.copytree(finished, job_dir, symlinks=True)
    return job_dir


def _rerun(job_dir: Path, tmp_path: Path, *extra: str):
    return run_train([*ARGS, *extra, f"hydra.run.dir={job_dir}"], tmp_path, env=WIDE)


def _unchanged(job_dir: Path, before: dict) -> None:
    """The record as it was, its attempts included: the run did not take the directory."""
    assert summary(job_dir) == before
    assert json.loads((job_dir / "attempts.json").read_text()) == before["attempts"]


def test_fewer_max_steps_than_a_finished_job_has_is_refused_and_keeps_its_record(
    finished, tmp_path
):
    job_dir = _copy(finished, tmp_path)
    before, wandb_before = summary(job_dir), _tree(job_dir / "wandb")
    proc = _rerun(job_dir, tmp_path, "trainer.max_steps=3")
    assert proc.returncode == 1, explain(proc)
    why = "trainer.max_steps=3 is below the step this job resumes from"
    assert why in proc.stdout and "holds step 7" in proc.stdout, explain(proc)
    _unchanged(job_dir, before)  # ok, metrics, telemetry, stop_reason, attempts
    assert _tree(job_dir / "wandb") == wandb_before  # no W&B attempt


def test_a_finished_job_rerun_with_nothing_to_train_changes_no_figure(finished, tmp_path):
    job_dir = _copy(finished, tmp_path)
    before, wandb_before = summary(job_dir), _tree(job_dir / "wandb")
    assert before["telemetry"]["measured_steps"] > 0
    proc = _rerun(job_dir, tmp_path, "trainer.log_every_n_steps=2")  # a change resume allows
    assert proc.returncode == 0, explain(proc)
    assert "nothing to train" in proc.stdout, explain(proc)
    _unchanged(job_dir, before)  # telemetry and all
    assert _tree(job_dir / "wandb") == wandb_before  # no W&B attempt


def test_a_damaged_newest_checkpoint_is_taken_out_of_the_run(finished, tmp_path):
    job_dir = _copy(finished, tmp_path)
    ckpt = job_dir / "checkpoints"
    newest = ckpt / "step-00000007.ckpt"
    shard = flip_a_byte(newest)  # one byte of tensor data
    data = shard.read_bytes()

    proc = _rerun(job_dir, tmp_path, "trainer.max_steps=10")
    assert proc.returncode == 0, explain(proc)
    output = proc.stdout + proc.stderr
    assert f"resumed from {ckpt / 'step-00000006.ckpt'} at step 6" in output, explain(proc)
    attempts = summary(job_dir)["attempts"]
    assert [(a["from_step"], a["ended"]) for a in attempts] == [(0, "ok"), (6, "ok")]
    # step 7 no longer counts toward keep_last_k=3: step 6, resumed from, is kept
    assert _listed(job_dir) == ["step-00000006.ckpt", "step-00000008.ckpt", "step-00000010.ckpt"]
    kept = ckpt / "step-00000007.ckpt.damaged" / shard.name
    assert kept.read_bytes() == data  # kept for a look
    assert f"moved damaged checkpoint to {ckpt / 'step-00000007.ckpt.damaged'}" in output


@pytest.mark.parametrize(
    ("resume", "expected"),
    [
        (lambda job: "", "trainer.resume is empty: give auto"),
        (
            lambda job: str(job / "checkpoints"),
            "is a directory, not a checkpoint: pass one of its checkpoints (newest: {newest})",
        ),
        (
            lambda job: str(job),
            "is a directory, not a checkpoint: pass one of its checkpoints (newest: {newest})",
        ),
    ],
    ids=["empty", "checkpoint-dir", "job-dir"],
)
def test_a_resume_that_names_no_checkpoint_says_what_to_pass(finished, tmp_path, resume, expected):
    job_dir = tmp_path / "new"
    newest = finished / "checkpoints" / "step-00000007.ckpt"
    proc = run_train(
        [*FAST, f"trainer.resume={resume(finished)}", f"hydra.run.dir={job_dir}"], tmp_path
    )
    assert proc.returncode == 1, explain(proc)
    record = summary(job_dir)
    assert record["error_stage"] == "config", record["error"]
    assert expected.format(newest=newest) in record["error"], record["error"]
    assert "damaged" not in record["error"]
    assert not (job_dir / "wandb").exists()


def test_a_truncated_fsdp_shard_is_taken_out_of_the_run(tmp_path):
    """The same with a sharded checkpoint (FSDP on a mesh of one rank, in this process)."""
    fsdp = ["trainer.accelerator=cpu", "trainer.strategy=fsdp", "trainer.max_steps=6"]
    args = [*fsdp, "trainer.checkpoint_every_n_steps=2", "trainer.keep_last_k=3"]
    job_dir = tmp_path / "job"
    proc = run_train([*FAST, *args, f"hydra.run.dir={job_dir}"], tmp_path)
    assert proc.returncode == 0, explain(proc)
    ckpt = job_dir / "checkpoints"
    shard = ckpt / "step-00000006.ckpt" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])

    proc = run_train([*FAST, *args, "trainer.max_steps=8", f"hydra.run.dir={job_dir}"], tmp_path)
    assert proc.returncode == 0, explain(proc)
    assert f"resumed from {ckpt / 'step-00000004.ckpt'} at step 4" in proc.stdout + proc.stderr
    assert [a["from_step"] for a in summary(job_dir)["attempts"]] == [0, 4]
    assert _listed(job_dir) == ["step-00000004.ckpt", "step-00000006.ckpt", "step-00000008.ckpt"]
    damaged = ckpt / "step-00000006.ckpt.damaged" / "__0_0.distcp"
    assert damaged.stat().st_size < (ckpt / "step-00000006.ckpt" / "__0_0.distcp").stat().st_size
