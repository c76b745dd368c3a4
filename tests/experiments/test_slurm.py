"""kiln-train on a real SLURM cluster (``scripts/slurm_local.sh``), one node per job.

Run with ``make test-slurm`` (starts the cluster first); skipped where ``sbatch`` is missing.
Every job is two SLURM tasks on one node (``--ntasks-per-node=2``) training one gloo DDP job
on the CPU; ``test_slurm_multinode.py`` has the jobs that span nodes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from end_signal_hook import HOOK
from slurm_helpers import (
    end,
    hold_env,
    job_field,
    signal_at_step,
    start_sweep,
    task_logs,
    task_results,
    wait_for_file,
    wait_for_log,
)
from train_helpers import explain, job_dirs, run_train, summary

from kiln.experiments.tracking import wandb_files

pytestmark = pytest.mark.slurm

TWO_TASKS = [
    "launcher=slurm",
    "hydra.launcher.partition=debug",
    "trainer.accelerator=cpu",
    "trainer.devices=2",
    "debug=fast",
    "trainer.max_steps=4",
    "compile.backend=aot_eager",
]


def test_two_job_sweep_runs_each_job_as_two_slurm_tasks(tmp_path):
    started = time.perf_counter()
    proc = run_train(
        ["-m", *TWO_TASKS, "precision=32-true,bf16-mixed"], tmp_path, timeout=1500, process=True
    )
    elapsed = time.perf_counter() - started
    print(f"2-job SLURM sweep (2 tasks each): {elapsed:.0f}s")
    assert proc.returncode == 0, explain(proc)
    dirs = job_dirs(tmp_path)
    assert len(dirs) == 2, dirs
    records = [summary(d) for d in dirs]
    assert [r["precision"] for r in records] == ["32-true", "bf16-mixed"]
    for job_dir, record in zip(dirs, records, strict=True):
        assert record["status"] == "ok", record["error"]
        assert (record["devices"], record["global_step"]) == (2, 4)
        # SLURM started both ranks of the job, and both trained in one process group
        logs = task_logs(job_dir)
        assert sorted(logs) == [0, 1], logs.keys()
        for rank, log in logs.items():
            assert f"global_rank={rank}(2)" in log, log[-3000:]
            assert f"GLOBAL_RANK: {rank}, MEMBER: {rank + 1}/2" in log, log[-3000:]
        assert task_results(job_dir) == ["success", "success"]
        # one W&B run per job, written by rank 0 only
        runs = sorted((job_dir / "wandb").glob("offline-run-*"))
        assert len(runs) == 1, runs
        assert record["wandb"]["dir"] == str(runs[0].relative_to(job_dir))
        run = wandb_files.read_run(runs[0])
        assert "devices:2" in run["tags"]
        logged = [r for r in wandb_files.read_history(runs[0]) if "train/loss" in r]
        assert [r["trainer/global_step"] for r in logged] == [r["step"] for r in record["history"]]
    assert not list(tmp_path.glob("wandb")), "a rank other than 0 opened a W&B run"
    # jobs that differ only in precision start from the same weights, on separate SLURM jobs
    assert records[0]["init_weights_sha256"] == records[1]["init_weights_sha256"] is not None
    assert records[0]["seed"] == records[1]["seed"] == 0


def test_one_slurm_task_for_two_devices_fails_naming_both_numbers(tmp_path):
    """``srun --ntasks=1`` (no SLURM_NTASKS_PER_NODE) with trainer.devices=2 fails instead of
    training on one process while the summary and tags say 2 devices."""
    env = {**os.environ, "KILN_LOG_DIR": str(tmp_path), "WANDB_MODE": "offline"}
    env.pop("SLURM_NTASKS_PER_NODE", None)
    cmd = ["srun", "--ntasks=1", sys.executable, "-m", "kiln.experiments.train", *TWO_TASKS[2:]]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode != 0, explain(proc)
    record = summary(job_dirs(tmp_path)[0])
    assert record["status"] == "failed"
    error = record["error"]
    assert "fabric.world_size=1" in error, error
    assert "trainer.devices=2 x trainer.num_nodes=1" in error, error
    assert "--ntasks-per-node=2" in error, error
    assert record["global_step"] == 0 and not record["history"]


STARTING = ["trainer.accelerator=cpu", "debug=fast", "trainer.max_steps=4"]
STARTING += ["compile.backend=aot_eager"]


def test_usr2_while_the_job_starts_requeues_it(tmp_path):
    """USR2 while submitit loads the job's pickle (before submitit or kiln installed a
    handler) must not kill the tasks: the job's first act defers it, submitit requeues the
    job once it can. A USR2 in the next attempt's config stage (its attempt recorded,
    ``end_signal_hook`` holds it there), under ``preempt_requeue=false`` (time limits requeue
    whatever it says), requeues it again and its attempt says ``requeued``; the sweep ends
    ok."""
    marker = tmp_path / "config-stage"
    args = [*TWO_TASKS[2:], HOOK[0], "hydra.launcher.preempt_requeue=false"]
    sweep, sweep_dir = start_sweep(tmp_path, args, env=hold_env("KILN_TEST_HOLD_START", marker))
    job_id = wait_for_log(sweep, sweep_dir, "Loading pickle")
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True, timeout=60)
    wait_for_file(sweep, marker)  # the requeued attempt, recorded, in its config stage
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True, timeout=60)
    end(sweep, timeout=900)
    output = (tmp_path / "sweep.log").read_text()[-6000:]
    assert sweep.returncode == 0, output
    record = summary(sweep_dir / "0")
    assert record["status"] == "ok" and record["global_step"] == 4, record["error"]
    assert record["devices"] == 2
    starting, trained = record["attempts"]
    assert (starting["ended"], starting["at_step"]) == ("requeued", 0), starting
    assert "error" not in starting, starting
    assert trained["ended"] == "ok" and trained["from_step"] == 0, trained
    assert job_field(job_id, "Restarts") == "2"
    # every attempt: SLURM appends to a requeued job's logs
    folder = sweep_dir / ".submitit" / job_id
    log = "".join((folder / f"{job_id}_0_log.{ext}").read_text() for ext in ("out", "err"))
    assert "kiln: SIGUSR2 while the job starts: acted on once started" in log, log
    assert f"Requeued job {job_id}" in log, log


def test_a_job_killed_while_it_starts_fails_the_sweep_instead_of_a_wait_for_ever(tmp_path):
    """A job that dies without a result (SIGKILL, here at start-up) is one SLURM no longer
    runs: without accounting (no ``sacct``) submitit read its state UNKNOWN for ever."""
    sweep, sweep_dir = start_sweep(tmp_path, STARTING)
    job_id = wait_for_log(sweep, sweep_dir, "Loading pickle")
    subprocess.run(["scancel", "--signal=KILL", job_id], check=True, timeout=60)
    end(sweep, timeout=300)
    output = (tmp_path / "sweep.log").read_text()
    assert sweep.returncode == 1, output[-6000:]
    assert f"SLURM job {job_id} (sweep job #0" in output, output[-6000:]
    assert "without a result: it died before kiln could record it" in output, output[-6000:]


def test_usr2_requeues_the_job_which_resumes_exactly_in_one_wandb_run(tmp_path):
    """``scancel --signal=USR2`` (what SLURM sends before a time limit or a preemption)
    mid-run: kiln checkpoints at the next step boundary (none is due before the end),
    submitit requeues the job, which resumes from that step into its directory and W&B run
    and ends as an uninterrupted run does."""
    steps = 40
    args = [
        "trainer.accelerator=cpu",
        "debug=fast",
        f"trainer.max_steps={steps}",
        "compile.backend=aot_eager",
        "trainer.checkpoint_every_n_steps=1000",
        "trainer.log_every_n_steps=1",
        # the SLURM task holds one CPU (cpus_per_task=1), the plain run all the cores: by
        # default each computes on its own, and float sums add in another order
        "trainer.threads_per_rank=1",
    ]
    sweep, sweep_dir = start_sweep(tmp_path, args)
    job_id = signal_at_step(sweep, sweep_dir, 2, tasks=1)
    sweep.wait(timeout=1500)
    assert sweep.returncode == 0, (tmp_path / "sweep.log").read_text()[-6000:]
    assert job_field(job_id, "Restarts") == "1"
    job_dir = sweep_dir / "0"
    record = summary(job_dir)
    assert record["status"] == "ok" and record["global_step"] == steps
    first, second = record["attempts"]
    assert first["ended"] == "requeued", record["attempts"]
    # it resumed from the step where USR2 stopped it: the checkpoint written there
    assert 2 <= first["at_step"] == second["from_step"] < steps, record["attempts"]
    assert second["ended"] == "ok"
    run_id = (job_dir / "wandb_run_id").read_text().strip()
    files = sorted((job_dir / "wandb").glob("*run-*-*/*.wandb"))
    assert len(files) == 2 and {wandb_files.read_run(f)["id"] for f in files} == {run_id}
    rows = [r for f in files for r in wandb_files.read_history(f) if "train/loss" in r]
    assert sorted(r["trainer/global_step"] for r in rows) == list(range(1, steps + 1))
    # an uninterrupted run of the same job ends with the same losses, bit for bit
    plain = run_train(
        [*args, f"hydra.run.dir={tmp_path / 'plain'}"], tmp_path, timeout=900, process=True
    )
    assert plain.returncode == 0, explain(plain)
    assert record["history"] == summary(tmp_path / "plain")["history"]
    assert record["metrics"] == summary(tmp_path / "plain")["metrics"]
