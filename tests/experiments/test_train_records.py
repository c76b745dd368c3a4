"""Nothing a user types destroys a job's record: an explicit resume is checked like
``resume=auto``, a refused attempt leaves a finished job untouched, a job dir has one writer,
a lost run.json is rebuilt from verified checkpoints, another job's checkpoint starts a run
of its own, a full disk costs no checkpoint, and inputs kiln refuses open no W&B run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from checkpoint_files import flip_a_byte, truncate
from train_helpers import FAST, explain, run_train, summary

CKPT = ["trainer.checkpoint_every_n_steps=2", "trainer.keep_last_k=2"]
ARGS = [*FAST, *CKPT]  # 4 steps: checkpoints at steps 2 and 4


WIDE = {"COLUMNS": "500"}  # the end-of-run table keeps each error on one line


def _run_file(job_dir: Path) -> dict:
    return json.loads((job_dir / "checkpoints" / "run.json").read_text())


def _tree(directory: Path) -> dict[str, bytes]:
    """Every file below ``directory`` with its bytes."""
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished job dir (W&B offline) with checkpoints at steps 2 and 4."""
    log_dir = tmp_path_factory.mktemp("records")
    job_dir = log_dir / "R"
    proc = run_train([*ARGS, f"hydra.run.dir={job_dir}"], log_dir)
    assert proc.returncode == 0, explain(proc)
    assert list(_run_file(job_dir)["checkpoints"]) == ["step-00000002.ckpt", "step-00000004.ckpt"]
    return job_dir


def _copy(finished: Path, tmp_path: Path) -> Path:
    job_dir = tmp_path / "job"
    shutil.copytree(finished, job_dir, symlinks=True)
    return job_dir


# -- 1. an explicit resume is checked like auto ---------------------------------------------


def test_an_explicit_resume_refuses_a_changed_config_naming_each_key(finished, tmp_path):
    ckpt = finished / "checkpoints" / "step-00000004.ckpt"
    changed = ["trainer.accumulate_grad_batches=3", "data.batch_size=16", "trainer.max_steps=36"]
    job_dir = tmp_path / "x"
    proc = run_train(
        [*ARGS, *changed, f"trainer.resume={ckpt}", f"hydra.run.dir={job_dir}"], tmp_path
    )
    assert proc.returncode == 1, explain(proc)
    record = summary(job_dir)
    assert (record["status"], record["error_stage"]) == ("failed", "config")
    assert f"resumes from {ckpt}" in record["error"]
    assert "data.batch_size: 8 -> 16" in record["error"], record["error"]
    assert "trainer.accumulate_grad_batches: 1 -> 3" in record["error"], record["error"]
    assert "max_steps: 4 -> 36" not in record["error"], record["error"]  # a resume may change it
    assert not (job_dir / "wandb").exists()


# -- 2. a refused attempt leaves a finished job untouched -----------------------------------


def _garbage_run_file(job_dir: Path) -> list[str]:
    (job_dir / "checkpoints" / "run.json").write_text("{not json")
    return []


def _fresh_run_into_it(job_dir: Path) -> list[str]:
    return ["trainer.resume=null"]


def _damaged_explicit_resume(job_dir: Path) -> list[str]:
    ckpt = job_dir / "checkpoints" / "step-00000004.ckpt"
    truncate(ckpt)
    return [f"trainer.resume={ckpt}"]


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (_fresh_run_into_it, "CheckpointDirError: trainer.checkpoint_dir="),
        (_garbage_run_file, "is not a kiln run file"),
        (_damaged_explicit_resume, "checkpoint is damaged"),
    ],
)
def test_a_refused_attempt_keeps_the_record_and_the_wandb_run(finished, tmp_path, make, error):
    job_dir = _copy(finished, tmp_path)
    extra = make(job_dir)
    before = summary(job_dir)
    wandb_before = _tree(job_dir / "wandb")
    proc = run_train([*ARGS, *extra, f"hydra.run.dir={job_dir}"], tmp_path, env=WIDE)
    assert proc.returncode == 1, explain(proc)
    assert error in proc.stdout, explain(proc)  # the refusal is shown
    assert summary(job_dir) == before  # ok, history, metrics, attempts: a record of its own
    assert error in proc.stderr.split("refused, its record stays as it was: ")[-1], explain(proc)
    assert _tree(job_dir / "wandb") == wandb_before  # its W&B run was never reopened


# -- 3. one writer per job dir --------------------------------------------------------------


@pytest.mark.process
def test_a_second_process_into_a_busy_job_dir_fails_at_once_naming_the_holder(tmp_path):
    job_dir = tmp_path / "z"
    env = {**os.environ, "KILN_LOG_DIR": str(tmp_path), "WANDB_MODE": "offline"}
    out = tmp_path / "first.log"
    long = [*FAST, "trainer.max_steps=100000", "trainer.checkpoint_every_n_steps=100000"]
    with out.open("w") as log:
        first = subprocess.Popen(
            [sys.executable, "-m", "kiln.experiments.train", *long, f"hydra.run.dir={job_dir}"],
            env=env,
            cwd=tmp_path,
            stdout=log,
            stderr=log,
        )
    try:
        deadline = time.monotonic() + 300
        while "step 1/" not in out.read_text():  # training: the lock is held
            assert first.poll() is None, out.read_text()[-4000:]
            assert time.monotonic() < deadline, "the first job never trained"
            time.sleep(0.1)
        attempts_before = (job_dir / "attempts.json").read_text()
        second = run_train(
            [*FAST, f"hydra.run.dir={job_dir}"], tmp_path, 300, env=WIDE, process=True
        )
        assert first.poll() is None, "the first job ended before the second one was refused"
        assert second.returncode == 1, explain(second)
        holder = f"job directory {job_dir} is in use: pid {first.pid} on host"
        assert holder in second.stdout and ", since 20" in second.stdout, explain(second)
        assert (job_dir / "attempts.json").read_text() == attempts_before  # not written
        assert not (job_dir / "summary.json").exists()  # the holder writes it, nobody else
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=300)
    assert first.returncode == 143, out.read_text()[-4000:]
    attempts = json.loads((job_dir / "attempts.json").read_text())
    assert [a["ended"] for a in attempts] == ["SIGTERM"]
    assert summary(job_dir)["global_step"] > 0


# -- 4. a lost run.json ---------------------------------------------------------------------


def test_a_lost_run_json_is_rebuilt_from_verified_checkpoints_which_are_pruned(finished, tmp_path):
    job_dir = _copy(finished, tmp_path)
    ckpt = job_dir / "checkpoints"
    run_id = _run_file(job_dir)["run_id"]
    (ckpt / "run.json").unlink()
    newest = ckpt / "step-00000004.ckpt"  # a flipped byte: its checksums.json catches it
    flip_a_byte(newest)
    # SIGKILLed saves leave these behind: the next start removes them
    (ckpt / ".run.json.abcd1234").write_text("{}")
    (ckpt / "step-00000005.ckpt.tmp").write_bytes(b"partial")

    proc = run_train([*ARGS, "trainer.max_steps=8", f"hydra.run.dir={job_dir}"], tmp_path)
    assert proc.returncode == 0, explain(proc)
    output = proc.stdout + proc.stderr
    assert f"resumed from {ckpt / 'step-00000002.ckpt'} at step 2" in output, explain(proc)
    assert "rebuilt from the checkpoints that prove themselves (step-00000002.ckpt)" in output
    rebuilt = _run_file(job_dir)
    assert rebuilt["run_id"] == run_id
    assert list(rebuilt["checkpoints"]) == ["step-00000006.ckpt", "step-00000008.ckpt"]
    # step 2, listed once rebuilt, was pruned (step 4 was re-saved over the damaged one)
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "run.json",
        "step-00000006.ckpt",
        "step-00000008.ckpt",
    ]


# -- 5. another job's checkpoint ------------------------------------------------------------


def test_resuming_another_jobs_checkpoint_gives_the_new_dir_its_own_run(finished, tmp_path):
    source = finished / "checkpoints" / "step-00000004.ckpt"
    job_dir = tmp_path / "new"
    args = [*ARGS, "trainer.max_steps=6", f"trainer.resume={source}", f"hydra.run.dir={job_dir}"]
    proc = run_train(args, tmp_path)
    assert proc.returncode == 0, explain(proc)
    theirs, ours = _run_file(finished), _run_file(job_dir)
    assert ours["run_id"] != theirs["run_id"]
    assert ours["started_from"] == {
        "path": str(source),
        "run_id": theirs["run_id"],
        "global_step": 4,
    }
    meta = torch.load(job_dir / "checkpoints" / "step-00000006.ckpt" / "meta.pt", weights_only=True)
    assert meta["loop"]["run_id"] == ours["run_id"] and meta["loop"]["global_step"] == 6
    assert (job_dir / "wandb_run_id").read_text() != (finished / "wandb_run_id").read_text()


# -- 6. a full disk -------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 30 MiB tmpfs (bert-tiny's checkpoints are 12 MB: two fit, a third does not)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=30m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip() or proc.returncode}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_names_the_checkpoint_and_keeps_the_good_ones(small_disk, tmp_path):
    ckpt = small_disk / "checkpoints"
    args = [*FAST, "trainer.checkpoint_every_n_steps=1", "trainer.keep_last_k=2"]
    proc = run_train(
        [*args, f"trainer.checkpoint_dir={ckpt}", f"hydra.run.dir={tmp_path / 'j'}"], tmp_path
    )
    assert proc.returncode == 1, explain(proc)
    error = summary(tmp_path / "j")["error"]
    assert f"could not write checkpoint {ckpt / 'step-00000003.ckpt'} (No space left" in error
    assert "this rank needs 11." in error and "MiB are free there" in error, error
    assert "no partial checkpoint is left" in error
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "run.json",
        "step-00000001.ckpt",
        "step-00000002.ckpt",
    ]
    from kiln.core.checkpoints.lookup import damage

    assert damage(ckpt / "step-00000002.ckpt") is None  # intact, checksum as recorded


# -- 11. refused before a W&B run opens -----------------------------------------------------


def _csv_without_label(tmp_path: Path) -> list[str]:
    path = tmp_path / "t.csv"
    path.write_text("sentence,target\n" + "".join(f"film {i},{i % 2}\n" for i in range(40)))
    return ["data.dataset=csv", f"data.data_files={path}", "data.text_column=sentence"]


def _labels_beyond_the_model(tmp_path: Path) -> list[str]:
    path = tmp_path / "five.csv"
    path.write_text("text,label\n" + "".join(f"film {i},{i % 5}\n" for i in range(40)))
    return ["data.dataset=csv", f"data.data_files={path}", "+model.num_labels=2"]


def _foreign_checkpoint(tmp_path: Path) -> list[str]:
    torch.save({"state_dict": {"w": torch.zeros(2)}}, tmp_path / "foreign.ckpt")
    return [f"trainer.resume={tmp_path / 'foreign.ckpt'}"]


def _truncated_checkpoint(tmp_path: Path, finished: Path) -> list[str]:
    shutil.copytree(finished / "checkpoints" / "step-00000004.ckpt", tmp_path / "cut.ckpt")
    truncate(tmp_path / "cut.ckpt")
    return [f"trainer.resume={tmp_path / 'cut.ckpt'}"]


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda tmp, _: [f"trainer.resume={tmp / 'nope.ckpt'}"], "no such checkpoint file"),
        (_truncated_checkpoint, "does not match the checksum"),
        (lambda tmp, _: _foreign_checkpoint(tmp), "foreign.ckpt' is not a kiln checkpoint"),
        (lambda tmp, _: _csv_without_label(tmp), "the label column 'label' is not in the data"),
        (lambda tmp, _: _labels_beyond_the_model(tmp), "the model has num_labels=2 but the data"),
        (lambda tmp, _: ["data.batch_size=100", "data.num_train=64"], "fewer than one batch"),
        (lambda tmp, _: ["trainer.accelerator=cuda"], "trainer.accelerator='cuda': this machine"),
    ],
    ids=[
        "missing",
        "truncated",
        "foreign",
        "no-label-column",
        "labels-out-of-range",
        "batch-too-large",
        "cuda",
    ],
)
def test_inputs_kiln_refuses_open_no_wandb_run(finished, tmp_path, make, error):
    if "cuda" in error and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    job_dir = tmp_path / "job"
    proc = run_train([*FAST, *make(tmp_path, finished), f"hydra.run.dir={job_dir}"], tmp_path)
    assert proc.returncode == 1, explain(proc)
    record = summary(job_dir)
    assert record["status"] == "failed" and error in record["error"], record["error"]
    assert record["wandb"] is None and not (job_dir / "wandb").exists()
    assert not (job_dir / "wandb_run_id").exists()
