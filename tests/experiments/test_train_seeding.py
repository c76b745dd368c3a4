"""``trainer.seed`` decides the starting weights: runs and sweep jobs start bit-identical."""

from __future__ import annotations

import pytest
from train_helpers import FAST, explain, job_dirs, run_train, summary

from kiln.experiments.tracking import wandb_files


def test_two_identical_runs_start_and_train_bit_identically(tmp_path):
    args = [*FAST, "trainer.max_steps=2", "trainer.deterministic=true", "logger=none"]
    records = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        proc = run_train(args, tmp_path / name)
        assert proc.returncode == 0, explain(proc)
        (job_dir,) = job_dirs(tmp_path / name)
        records.append(summary(job_dir))
    first, second = records
    assert first["seed"] == second["seed"] == 0
    assert len(first["init_weights_sha256"]) == 64
    assert first["init_weights_sha256"] == second["init_weights_sha256"]
    assert first["train_loss"] == second["train_loss"]
    assert first["history"] == second["history"] and len(first["history"]) == 2


def test_another_seed_starts_from_other_weights(tmp_path):
    proc = run_train(
        ["-m", *FAST, "trainer.max_steps=1", "logger=none", "trainer.seed=0,1"], tmp_path
    )
    assert proc.returncode == 0, explain(proc)
    zero, one = (summary(d) for d in job_dirs(tmp_path))
    assert (zero["seed"], one["seed"]) == (0, 1)
    assert zero["init_weights_sha256"] != one["init_weights_sha256"]


@pytest.mark.parametrize(
    "sweep",
    [
        pytest.param(["precision=32-true,bf16-mixed"], id="precision"),
        pytest.param(
            ["precision=32-true,bf16-mixed", "compile=none,default"],
            id="precision-x-compile",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_sweep_jobs_that_differ_in_precision_or_compile_start_from_the_same_weights(
    tmp_path, sweep
):
    """Basic launcher: the jobs run one after another in one process."""
    proc = run_train(["-m", *FAST, "trainer.max_steps=1", *sweep], tmp_path)
    assert proc.returncode == 0, explain(proc)
    dirs = job_dirs(tmp_path)
    records = [summary(d) for d in dirs]
    assert len(records) == 2 ** len(sweep) and all(r["status"] == "ok" for r in records)
    hashes = {r["init_weights_sha256"] for r in records}
    assert len(hashes) == 1 and None not in hashes
    # the seed and the hash are in each W&B run's config and summary too
    run_dir = sorted((dirs[-1] / "wandb").glob("offline-run-*"))[0]
    run = wandb_files.read_run(run_dir)
    assert run["config"]["seed"] == 0
    assert run["config"]["init_weights_sha256"] == records[-1]["init_weights_sha256"]
    assert (
        wandb_files.read_summary(run_dir)["init_weights_sha256"]
        == records[-1]["init_weights_sha256"]
    )


@pytest.mark.slow
def test_submitit_jobs_in_separate_processes_start_from_the_same_weights(tmp_path):
    proc = run_train(
        [
            "-m",
            "launcher=local_submitit",
            *FAST,
            "trainer.max_steps=1",
            "precision=32-true,bf16-mixed",
        ],
        tmp_path,
        timeout=900,
        process=True,
    )
    assert proc.returncode == 0, explain(proc)
    records = [summary(d) for d in job_dirs(tmp_path)]
    assert len({r["init_weights_sha256"] for r in records}) == 1
