"""kiln-train across two SLURM nodes: ``scripts/slurm_local.sh`` (``--nodes 2``, the default)
runs node0 and node1, one slurmd each in its own network namespace on a private bridge.

A job of ``trainer.num_nodes=2`` is one SLURM job whose ranks rendezvous at the first node's
address and train one gloo process group across the two namespaces. Its results are compared
with one node holding all the devices: float64 (``precision=64-true``) and the same global
batch, so the two must agree bit for bit. Skipped on a cluster of fewer than two nodes.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoint_files import saved_state
from end_signal_hook import HOOK
from slurm_helpers import (
    end,
    hold_env,
    job_field,
    signal_at_step,
    start_sweep,
    task_logs,
    task_pids,
    task_results,
    wait_for_end,
    wait_for_file,
    wait_for_log,
    wait_for_restarts,
    wait_for_step,
)
from train_helpers import explain, job_dirs, run_train, summary, user_env

from kiln.experiments.tracking import wandb_files

ROOT = Path(__file__).resolve().parents[2]
SLURM_LOCAL = ROOT / "scripts" / "slurm_local.sh"


def _cluster_nodes() -> list[str]:
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-p", "debug", "-o", "%N"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return sorted(set(out.split()))


pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        len(_cluster_nodes()) < 2,
        reason="needs a SLURM cluster of 2 nodes: sudo scripts/slurm_local.sh --nodes 2",
    ),
]

STEPS = 24
# the same job on any launcher: float64, a few steps, a loss logged at every step
JOB = [
    "trainer.accelerator=cpu",
    "debug=fast",
    f"trainer.max_steps={STEPS}",
    "compile=none",
    "precision=64-true",
    "trainer.log_every_n_steps=1",
    "trainer.checkpoint_every_n_steps=1000",  # only the last step (and a stop) checkpoints
]
TWO_NODES = ["launcher=slurm", "hydra.launcher.partition=debug", "trainer.num_nodes=2"]


def final_weights(record: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The model tensors of the job's last checkpoint."""
    checkpoint = Path(record["output_dir"]) / record["checkpoint"]  # relative to the job
    return saved_state(checkpoint, Path(tempfile.mkdtemp()))["model"]


def assert_same_weights(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert got.keys() == expected.keys()
    for name in expected:
        assert got[name].dtype == torch.float64, name
        assert torch.equal(got[name], expected[name]), name


def two_node_job(log_dir: Path, devices: int) -> tuple[Path, dict[str, Any], float]:
    """``kiln-train -m launcher=slurm trainer.num_nodes=2 trainer.devices=<devices>``: its one
    job's directory and record, and how long the sweep took."""
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    proc = run_train(
        ["-m", *TWO_NODES, *JOB, f"trainer.devices={devices}"], log_dir, timeout=1500, process=True
    )
    elapsed = time.perf_counter() - started
    assert proc.returncode == 0, explain(proc)
    dirs = job_dirs(log_dir)
    assert len(dirs) == 1, dirs
    return dirs[0], summary(dirs[0]), elapsed


def one_node_job(log_dir: Path, devices: int) -> dict[str, Any]:
    """The same job on this machine alone: one node, ``devices`` local worker processes."""
    log_dir.mkdir(parents=True, exist_ok=True)
    proc = run_train([*JOB, f"trainer.devices={devices}"], log_dir, timeout=1500, process=True)
    assert proc.returncode == 0, explain(proc)
    return summary(job_dirs(log_dir)[0])


def torchrun_job(log_dir: Path, devices: int) -> dict[str, Any]:
    """The job under ``torchrun --standalone --nproc-per-node <devices>`` on this machine."""
    run_dir = log_dir / "run"
    env = {**user_env(), "KILN_LOG_DIR": str(log_dir), "WANDB_MODE": "offline"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc-per-node={devices}", "-m", "kiln.experiments.train", *JOB]
    cmd += [f"trainer.devices={devices}", f"hydra.run.dir={run_dir}"]
    log_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(cmd, env=env, cwd=log_dir, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, explain(proc)
    return summary(run_dir)


@pytest.fixture(scope="module")
def two_nodes_one_task_each(tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    """One uninterrupted 2-node job of one rank per node (the reference of the preemption)."""
    job_dir, record, elapsed = two_node_job(tmp_path_factory.mktemp("two-nodes"), devices=1)
    print(f"2-node SLURM job (2 ranks, {STEPS} steps): {elapsed:.0f}s")
    return job_dir, record


def check_two_node_job(job_dir: Path, record: dict[str, Any], devices: int) -> None:
    """One job of ``2 x devices`` ranks on node0 and node1, one record and one W&B run."""
    ranks = 2 * devices
    assert record["status"] == "ok", record["error"]
    assert (record["devices"], record["global_step"]) == (ranks, STEPS)
    # every rank on its node (submitit's environment line), all in one process group
    logs = task_logs(job_dir)
    assert sorted(logs) == list(range(ranks)), logs.keys()
    for rank, log in logs.items():
        node = rank // devices
        assert f"hostname=node{node}, " in log, log[-3000:]
        assert f"node={node}(2), global_rank={rank}({ranks})" in log, log[-3000:]
        assert f"GLOBAL_RANK: {rank}, MEMBER: {rank + 1}/{ranks}" in log, log[-3000:]
    assert task_results(job_dir) == ["success"] * ranks
    # the record names both nodes; rank 0 (the writer) ran on the first
    machine = record["machine"]
    assert machine["slurm_nodes"] == ["node0", "node1"], machine
    assert machine["hostname"] == "node0"
    assert record["attempts"][0]["nodes"] == ["node0", "node1"]
    # one W&B run, one summary.json, written by rank 0 only
    runs = sorted((job_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs
    assert f"devices:{ranks}" in wandb_files.read_run(runs[0])["tags"]
    assert sorted(p.name for p in job_dir.parent.glob("*/summary.json")) == ["summary.json"]


def test_a_two_node_job_trains_as_one_node_with_both_devices(two_nodes_one_task_each, tmp_path):
    job_dir, record = two_nodes_one_task_each
    check_two_node_job(job_dir, record, devices=1)
    one = one_node_job(tmp_path, devices=2)
    assert record["history"] == one["history"]  # every step's loss, lr and gradient norm
    assert_same_weights(final_weights(record), final_weights(one))


@pytest.mark.slow  # 7 min on 2 busy cores; the 2-rank test above proves the same in make test-all
def test_two_nodes_of_two_ranks_train_as_one_node_of_four_ranks(tmp_path):
    job_dir, record, elapsed = two_node_job(tmp_path / "two", devices=2)
    print(f"2-node SLURM job (4 ranks, {STEPS} steps): {elapsed:.0f}s")
    check_two_node_job(job_dir, record, devices=2)
    # torchrun, not kiln's own launcher: that refuses more CPU workers than a 2-core machine
    # has cores, and torchrun's four ranks are the same four processes on one node
    one = torchrun_job(tmp_path / "one", devices=4)
    assert record["history"] == one["history"]
    assert_same_weights(final_weights(record), final_weights(one))


def check_wandb_run(job_dir: Path, files: int, whole: bool = True) -> None:
    """One W&B run in ``files`` files (an attempt, or a re-run that logged what it lacked,
    each), each step's training row once (``whole=False``: the last attempt's W&B service was
    signalled before it wrote them all: none twice)."""
    run_id = (job_dir / "wandb_run_id").read_text().strip()
    found = sorted((job_dir / "wandb").glob("*run-*-*/*.wandb"))
    assert len(found) == files, found
    assert {wandb_files.read_run(f).get("id", run_id) for f in found} == {run_id}
    rows = [r for f in found for r in wandb_files.read_history(f) if "train/loss" in r]
    logged = sorted(r["trainer/global_step"] for r in rows)
    if whole:
        assert logged == list(range(1, STEPS + 1))
    else:
        assert len(set(logged)) == len(logged) and set(logged) <= set(range(1, STEPS + 1))


def check_requeued_job(
    job_dir: Path, reference: dict[str, Any], requeues: int, signal: str, whole: bool = True
) -> list[dict[str, Any]]:
    """The job was requeued ``requeues`` times by ``signal`` (each time both ranks stopped
    at one step with its checkpoint) and ended as the uninterrupted 2-node job does, bit for
    bit, in one W&B run with each step's row once (``whole=False``: see
    :func:`check_wandb_run`). Returns its attempts."""
    record = summary(job_dir)
    assert record["status"] == "ok" and record["global_step"] == STEPS, record["error"]
    attempts = record["attempts"]
    assert [a["ended"] for a in attempts] == ["requeued"] * requeues + ["ok"], attempts
    for stopped, resumed in itertools.pairwise(attempts):
        assert 2 <= stopped["at_step"] == resumed["from_step"] < STEPS, attempts
        assert stopped["nodes"] == resumed["nodes"] == ["node0", "node1"]
        assert stopped["slurm_job_id"] == resumed["slurm_job_id"]
    # one checkpoint per stop (none periodic is due), the last step's
    steps = sorted(int(p.stem.split("-")[1]) for p in (job_dir / "checkpoints").glob("step-*"))
    assert steps[-1] == STEPS and set(steps) <= {a["at_step"] for a in attempts}, steps
    # both ranks (one per node) took the signal, once per stop
    logs = task_logs(job_dir)
    for rank in (0, 1):
        stops = logs[rank].count(f"{signal}: stopping at the next step boundary")
        assert stops == requeues, logs[rank][-3000:]
    # one W&B run over the attempts that trained, each step's row once (SLURM's preemption
    # SIGTERMs W&B's service too: that attempt's file may hold its header alone, and the
    # resumed attempt logs the rows the run lacks)
    check_wandb_run(job_dir, requeues + 1, whole)
    # the uninterrupted 2-node job: the same losses at every step and the same weights
    assert record["history"] == reference["history"]
    assert record["metrics"] == reference["metrics"]
    assert_same_weights(final_weights(record), final_weights(reference))
    return attempts


def test_usr2_to_every_process_or_to_the_batch_shell_requeues_once_each_time(
    two_nodes_one_task_each, tmp_path
):
    """A USR2 the ways sites send it, on the 2-node job: to the batch shell while it runs its
    setup, before the job step exists (``scancel --batch``, what ``--signal=B:USR2@`` does:
    the shell keeps it, the tasks requeue the job as soon as they start); then mid-run to
    every process (``--full``: each task gets it directly and through the shell) and to the
    batch shell alone (it passes it to the tasks). Each one requeues the job exactly once
    (SLURM's restart count), each mid-run one with a checkpoint at the step both ranks stopped
    at, and the job ends as the uninterrupted one does, bit for bit. (``scancel
    --signal=USR2`` to the tasks: ``test_fsdp_across_two_nodes_is_preempted_and_resumes``.)
    Then ``scancel`` once its record says ok (``end_signal_hook`` holds it before its W&B
    run's end; SLURM signals W&B's service too): the job ends ok, exit 0, no traceback, and the
    sweep reads it so."""
    started = time.perf_counter()
    setup = 'hydra.launcher.setup=["echo kiln-test: setup; sleep 2"]'
    args = [*TWO_NODES[2:], *JOB, "trainer.devices=1", setup, HOOK[0]]
    ended = tmp_path / "ended"
    sweep, sweep_dir = start_sweep(tmp_path, args, env=hold_env("KILN_TEST_HOLD_END", ended))
    job_dir = sweep_dir / "0"
    job_id = wait_for_log(sweep, sweep_dir, "kiln-test: setup")
    subprocess.run(["scancel", "--signal=USR2", "--batch", job_id], check=True, timeout=60)
    wait_for_restarts(sweep, job_id, 1)
    # mid-run: to every process, to the batch shell
    at = 2
    for restarts, how in enumerate([("--full",), ("--batch",)], start=2):
        assert signal_at_step(sweep, sweep_dir, at, tasks=2, how=how) == job_id
        wait_for_restarts(sweep, job_id, restarts)
        at = summary(job_dir)["attempts"][-1]["at_step"] + 2
    wait_for_file(sweep, ended)  # its record says ok, its W&B run has not ended
    subprocess.run(["scancel", job_id], check=True, timeout=60)
    end(sweep, timeout=1500)
    print(f"2-node job requeued 3 times (USR2 3 ways): {time.perf_counter() - started:.0f}s")
    output = (tmp_path / "sweep.log").read_text()
    assert sweep.returncode == 0, output[-6000:]
    assert "Traceback" not in output, output[-6000:]
    assert (job_field(job_id, "Restarts"), wait_for_end(job_id)) == ("3", "CANCELLED")
    _, plain = two_nodes_one_task_each
    check_requeued_job(job_dir, plain, requeues=2, signal="SIGUSR2", whole=False)
    assert "SIGTERM as the job ended: it ended ok" in task_logs(job_dir)[0]
    assert task_results(job_dir) == ["success", "success"]
    batch_log = "".join(task_logs(job_dir).values())
    assert "kiln: the batch shell got SIGUSR2 before the job step: kept for it" in batch_log
    assert batch_log.count("kiln: the batch shell got SIGUSR2: passed to the job step") == 2
    # the submitter says once why it does not ask sacct, and never prints sacct's failures
    assert output.count("SLURM accounting is off on this cluster") == 1, output[-6000:]
    assert "sacct" not in output.replace("so no sacct", ""), output[-6000:]


def _high_job() -> str:
    """Submit a job of partition ``high`` that needs every core of both nodes (it preempts a
    job of ``low`` or ``lowcancel``); returns its id."""
    every_core = ["-p", "high", "-N", "2", "--ntasks-per-node=2", "-o", "/dev/null"]
    return subprocess.run(
        ["sbatch", "--parsable", *every_core, "--wrap", "srun true"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()


def _preempted_by_high(
    sweep: subprocess.Popen, sweep_dir: Path, again_at: Path | None = None
) -> tuple[str, str]:
    """Once the sweep's 2-node job (one task per node) has logged step 2, a job of partition
    ``high`` that needs every core of both nodes preempts it; the sweep is waited for
    (``again_at``: once this file is there, another high job preempts the job again).
    Returns the two SLURM job ids (the kiln job's, the first high job's)."""
    job_id = wait_for_step(sweep, sweep_dir, 2)
    # the tasks pause (a slow step) until SLURM's preemption sends SIGCONT, then SIGTERM: the
    # tiny steps take less time than SLURM needs to schedule the high job
    tasks = task_pids(sweep_dir, 2)
    for pid in tasks:
        os.kill(pid, signal.SIGSTOP)
    highs = []
    try:
        highs.append(_high_job())
        if again_at is not None:
            wait_for_file(sweep, again_at)
            highs.append(_high_job())
        end(sweep, timeout=1500)
    finally:
        for high in highs:
            subprocess.run(["scancel", high], timeout=60)
        for pid in tasks:  # preempted, they run again already; if not, the test ends anyway
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    return job_id, highs[0]


def test_a_job_preempted_by_a_higher_priority_partition_checkpoints_requeues_and_resumes(
    two_nodes_one_task_each, tmp_path
):
    """SLURM's own preemption (scripts/slurm_local.sh: partition ``low``, PreemptMode=REQUEUE
    with a GraceTime, under ``high``): a job of ``high`` that needs every core of both nodes
    preempts the 2-node kiln job, whose tasks get SIGTERM. kiln tells it from a cancel
    (``scontrol``: still RUNNING, with a PreemptTime), stops both ranks at one step with a
    checkpoint and requeues the job once within the grace time (a job that ends in it is not
    requeued by SLURM); the high job runs, and the kiln job resumes and ends bit-identical.
    A second high job preempts it once its record says ok (``end_signal_hook`` holds it before
    its W&B run's end; SLURM signals W&B's service too): it ends ok, exit 0, no traceback,
    neither requeued nor failed (SLURM: ``COMPLETED``); the sweep run again skips it, keeps its
    record, and gives its W&B run the rows it lacks."""
    started = time.perf_counter()
    args = [*TWO_NODES[2:], *JOB, "trainer.devices=1", HOOK[0]]
    ended = tmp_path / "ended"
    env = hold_env("KILN_TEST_HOLD_END", ended)
    sweep, sweep_dir = start_sweep(tmp_path, args, partition="low", env=env)
    job_id, high = _preempted_by_high(sweep, sweep_dir, again_at=ended)
    print(f"2-node job preempted by a high-priority job: {time.perf_counter() - started:.0f}s")
    output = (tmp_path / "sweep.log").read_text()
    assert sweep.returncode == 0, output[-6000:]
    assert "Traceback" not in output, output[-6000:]
    assert job_field(high, "JobState") == "COMPLETED"
    assert job_field(job_id, "Restarts") == "1"  # kiln's requeue, and not SLURM's after it
    assert wait_for_end(job_id) == "COMPLETED"  # the ok end, as its record says
    job_dir = sweep_dir / "0"
    assert "SIGTERM as the job ended: it ended ok" in task_logs(job_dir)[0]
    _, plain = two_nodes_one_task_each
    (stopped, resumed) = check_requeued_job(job_dir, plain, 1, "SIGTERM", whole=False)
    # the high job ran while the kiln job waited: it started after the stop, before the resume
    high_start = job_field(high, "StartTime")
    ended, restarted = stopped["ended_at"][:19], resumed["started_at"][:19]  # local, seconds
    assert ended <= high_start <= restarted, (ended, high_start, restarted)
    # the sweep again: the job is skipped, its record stays, its W&B run gets what it lacks
    preempted = summary(job_dir)
    (tmp_path / "sweep.log").rename(tmp_path / "sweep-preempted.log")
    # the plugin on the path (the sweep checks every job's config, plugins loaded), no hold
    sweep, _ = start_sweep(tmp_path, args, partition="low", env={"PYTHONPATH": env["PYTHONPATH"]})
    end(sweep, timeout=900)
    assert sweep.returncode == 0, (tmp_path / "sweep.log").read_text()[-6000:]
    assert summary(job_dir) == preempted
    check_wandb_run(job_dir, files=3)  # the two attempts' files, and the re-run's


def test_a_cancel_partition_preemption_stops_the_job_and_a_rerun_resumes_it(
    two_nodes_one_task_each, tmp_path
):
    """A partition whose PreemptMode is CANCEL (``lowcancel``): the site ends preempted jobs,
    and ``hydra.launcher.preempt_requeue=auto`` (the default) follows it. Both ranks stop at
    one step with a checkpoint, the job is not requeued, its record says ``stopped`` and why;
    the same sweep run again resumes it and ends as the uninterrupted job does."""
    args = [*TWO_NODES[2:], *JOB, "trainer.devices=1"]
    sweep, sweep_dir = start_sweep(tmp_path, args, partition="lowcancel")
    job_id, _ = _preempted_by_high(sweep, sweep_dir)
    first = (tmp_path / "sweep.log").rename(tmp_path / "sweep-preempted.log").read_text()
    assert job_field(job_id, "Restarts") == "0", first[-6000:]
    record = summary(sweep_dir / "0")
    assert record["status"] == "stopped", record
    assert (record["stop_reason"], record["stop_signal"]) == ("signal", "SIGTERM")
    preemption = {
        "partition": "lowcancel",
        "preempt_mode": "CANCEL",
        "preempt_requeue": "auto",
        "requeued": False,
    }
    assert record["preemption"] == preemption
    (attempt,) = record["attempts"]
    assert attempt["ended"] == "SIGTERM" and attempt["preemption"] == preemption, attempt
    stopped_at = record["global_step"]
    assert 2 <= stopped_at < STEPS
    assert (sweep_dir / "0" / "checkpoints" / f"step-{stopped_at:08d}.ckpt").is_dir()
    # the sweep ends non-zero, saying what happened in one message (no traceback)
    assert sweep.returncode == 1, first[-6000:]
    assert "Traceback" not in first, first[-6000:]
    assert (
        f"kiln stopped it by SIGTERM at step {stopped_at} with a checkpoint, preempted on "
        "partition lowcancel (PreemptMode=CANCEL, hydra.launcher.preempt_requeue=auto: not "
        "requeued); its summary.json says stopped, and running the sweep again resumes it"
    ) in first, first[-6000:]
    # the sweep run again (nothing preempts it now) resumes the job where it stopped
    sweep, _ = start_sweep(tmp_path, args, partition="lowcancel")
    end(sweep, timeout=900)
    assert sweep.returncode == 0, (tmp_path / "sweep.log").read_text()[-6000:]
    record = summary(sweep_dir / "0")
    assert record["status"] == "ok" and record["global_step"] == STEPS, record["error"]
    assert [a["ended"] for a in record["attempts"]] == ["SIGTERM", "ok"]
    assert record["attempts"][1]["from_step"] == stopped_at
    _, plain = two_nodes_one_task_each
    assert record["history"] == plain["history"]
    assert_same_weights(final_weights(record), final_weights(plain))


def test_preempt_requeue_true_requeues_a_job_that_a_cancel_partition_preempts(
    two_nodes_one_task_each, tmp_path
):
    """``hydra.launcher.preempt_requeue=true`` on a CANCEL partition: kiln requeues the
    preempted job itself, which resumes and ends bit-identical in one W&B run."""
    args = [*TWO_NODES[2:], *JOB, "trainer.devices=1", "hydra.launcher.preempt_requeue=true"]
    sweep, sweep_dir = start_sweep(tmp_path, args, partition="lowcancel")
    job_id, _ = _preempted_by_high(sweep, sweep_dir)
    assert sweep.returncode == 0, (tmp_path / "sweep.log").read_text()[-6000:]
    assert job_field(job_id, "Restarts") == "1"
    _, plain = two_nodes_one_task_each
    stopped, _ = check_requeued_job(sweep_dir / "0", plain, requeues=1, signal="SIGTERM")
    assert stopped["preemption"] == {
        "partition": "lowcancel",
        "preempt_mode": "CANCEL",
        "preempt_requeue": "true",
        "requeued": True,
    }


def test_a_requeue_slurm_refuses_is_recorded_as_a_failure_with_scontrols_reason(
    two_nodes_one_task_each, tmp_path
):
    """``preempt_requeue=true`` for a job submitted ``--no-requeue`` on a CANCEL partition:
    kiln checkpoints, ``scontrol requeue`` is refused, and the record says failed with
    scontrol's own reason (not ``requeued``, not a bare exit status)."""
    args = [*TWO_NODES[2:], *JOB, "trainer.devices=1", "hydra.launcher.preempt_requeue=true"]
    args += ["+hydra.launcher.additional_parameters.no_requeue=true"]
    sweep, sweep_dir = start_sweep(tmp_path, args, partition="lowcancel")
    job_id, _ = _preempted_by_high(sweep, sweep_dir)
    output = (tmp_path / "sweep.log").read_text()
    assert sweep.returncode == 1, output[-6000:]
    assert job_field(job_id, "Restarts") == "0"
    record = summary(sweep_dir / "0")
    assert record["status"] == "failed", record
    assert record["error"].startswith("stopped by SIGTERM with a checkpoint, not requeued: ")
    assert f"scontrol requeue {job_id} was refused: " in record["error"], record["error"]
    (attempt,) = record["attempts"]
    assert attempt["ended"] == "failed" and attempt["error"] == record["error"], attempt
    assert attempt["preemption"]["requeued"] is True  # what kiln set out to do
    stopped_at = record["global_step"]
    assert (sweep_dir / "0" / "checkpoints" / f"step-{stopped_at:08d}.ckpt").is_dir()
    assert f"kiln recorded it failed at step {stopped_at} ({record['error']})" in output


def _fail_node(node: str) -> None:
    """What a node failure does to a job: node<i>'s slurmd stops and its tasks die."""
    pidfile = Path(f"/run/slurm/slurmd-{node}.pid")
    os.kill(int(pidfile.read_text()), signal.SIGKILL)
    pids = subprocess.run(
        ["ip", "netns", "pids", f"kiln-{node}"], capture_output=True, text=True, check=True
    ).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def _wait_for_record(sweep: subprocess.Popen, job_dir: Path, status: str) -> dict[str, Any]:
    deadline = time.monotonic() + 300
    while True:
        assert sweep.poll() is None and time.monotonic() < deadline, f"no {status!r} record"
        try:
            record = summary(job_dir)
        except (OSError, ValueError):  # not written yet, or being written
            record = {}
        if record.get("status") == status:
            return record
        time.sleep(0.5)


def _wait_for_job(sweep: subprocess.Popen, job_id: str, text: str) -> str:
    deadline = time.monotonic() + 300
    while True:
        assert sweep.poll() is None and time.monotonic() < deadline, f"job {job_id}: no {text}"
        job = subprocess.run(
            ["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=60
        ).stdout
        if text in job:
            return job
        time.sleep(1)


def test_a_node_that_fails_mid_run_is_recorded_and_the_requeued_job_resumes_from_a_checkpoint(
    two_nodes_one_task_each, tmp_path
):
    """node1 fails mid-run (its slurmd and its tasks killed): rank 0 records the attempt
    ``failed``, naming the lost node and the job's nodes; SLURM requeues the job (its default
    for a node failure) and once the node is back the job resumes from its last checkpoint
    on both nodes and ends as the uninterrupted job does."""
    args = [*TWO_NODES[2:], *JOB, "trainer.devices=1", "trainer.checkpoint_every_n_steps=2"]
    sweep, sweep_dir = start_sweep(tmp_path, args)
    job_dir = sweep_dir / "0"
    try:
        job_id = wait_for_step(sweep, sweep_dir, 5)  # checkpoints at steps 2 and 4 are written
        _fail_node("node1")
        record = _wait_for_record(sweep, job_dir, "failed")
        (attempt,) = record["attempts"]
        assert attempt["ended"] == "failed" and attempt["at_step"] >= 4, attempt
        assert attempt["nodes"] == ["node0", "node1"] and attempt["slurm_job_id"] == job_id
        assert attempt["host"] == "node0"
        # gloo: "Connection closed by peer [10.77.0.11]:<port>" or "Read error [...]:<port>:
        # Connection reset by peer", whichever side of the socket saw it first
        assert re.search(r"\[10\.77\.0\.11\]:\d+ \(node1\)", record["error"]), record["error"]
        checkpoints = sorted((job_dir / "checkpoints").glob("step-*.ckpt"))
        last = int(checkpoints[-1].stem.split("-")[1])
        assert last >= 4, checkpoints
        # SLURM marks node1 DOWN once its slurmd missed SlurmdTimeout (20 s) and requeues
        _wait_for_job(sweep, job_id, "Restarts=1")
    finally:  # node1 comes back (its namespace is still there): slurmd restarts, it resumes
        subprocess.run([str(SLURM_LOCAL)], check=True, timeout=300)
    end(sweep, timeout=1500)
    assert sweep.returncode == 0, (tmp_path / "sweep.log").read_text()[-6000:]
    record = summary(job_dir)
    assert record["status"] == "ok" and record["global_step"] == STEPS, record["error"]
    failed, resumed = record["attempts"]
    assert failed["ended"] == "failed" and "(node1)" in failed["error"], failed
    assert resumed["from_step"] == last and resumed["ended"] == "ok", record["attempts"]
    assert resumed["nodes"] == ["node0", "node1"]
    _, plain = two_nodes_one_task_each
    assert record["history"] == plain["history"]
    assert_same_weights(final_weights(record), final_weights(plain))


def test_torchrun_with_one_agent_on_each_node_trains_as_the_slurm_job(
    two_nodes_one_task_each, tmp_path
):
    """packages/experiments/README.md's multi-node torchrun recipe, run for real: one agent in
    each node's namespace (``scripts/slurm_local.sh on node<i>``), a c10d rendezvous at node0,
    gives the 2-node SLURM job's losses and weights."""
    run_dir = tmp_path / "run"
    env = {**user_env(), "KILN_LOG_DIR": str(tmp_path), "WANDB_MODE": "offline"}
    agents = []
    started = time.perf_counter()
    for rank in (0, 1):
        cmd = [
            str(SLURM_LOCAL),
            "on",
            f"node{rank}",
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            "--nproc-per-node=1",
            f"--node-rank={rank}",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=node0:29500",
            "-m",
            "kiln.experiments.train",
            *JOB,
            "trainer.num_nodes=2",
            "trainer.devices=1",
            f"hydra.run.dir={run_dir}",
        ]
        log = (tmp_path / f"node{rank}.log").open("w")
        agents.append(
            subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
        )
    for agent in agents:
        try:
            agent.wait(timeout=1200)
        finally:
            if agent.poll() is None:
                agent.kill()
    print(f"torchrun on 2 nodes (2 ranks, {STEPS} steps): {time.perf_counter() - started:.0f}s")
    logs = {rank: (tmp_path / f"node{rank}.log").read_text() for rank in (0, 1)}
    assert [a.returncode for a in agents] == [0, 0], logs
    record = summary(run_dir)
    assert record["status"] == "ok", record["error"]
    assert (record["devices"], record["global_step"]) == (2, STEPS)
    assert record["machine"]["hostname"] in ("node0", "node1")  # rank 0 is who joined first
    _, slurm = two_nodes_one_task_each
    assert record["history"] == slurm["history"]
    assert_same_weights(final_weights(record), final_weights(slurm))


@pytest.mark.parametrize(
    ("sharding", "devices"),
    [("full", 1), ("hybrid", 2)],  # hybrid: shard within each node's 2 ranks, replicate across
)
def test_fsdp_across_two_nodes_is_preempted_and_resumes(
    two_nodes_one_task_each, tmp_path, sharding, devices
):
    """``trainer.strategy=fsdp`` on both nodes: USR2 mid-run stops every rank at one step with
    a checkpoint of a file per rank, the requeued job resumes from it on both nodes,
    in one W&B run, and ends; full sharding over 2 ranks follows the DDP job's losses."""
    ranks = 2 * devices
    fsdp = ["trainer.strategy=fsdp", f"trainer.fsdp.sharding={sharding}"]
    args = [*TWO_NODES[2:], *JOB, f"trainer.devices={devices}", *fsdp]
    started = time.perf_counter()
    sweep, sweep_dir = start_sweep(tmp_path, args)
    signal_at_step(sweep, sweep_dir, 2, tasks=ranks)
    end(sweep, timeout=1500)
    elapsed = time.perf_counter() - started
    print(f"2-node FSDP {sharding} ({ranks} ranks), preempted once: {elapsed:.0f}s")
    assert sweep.returncode == 0, (tmp_path / "sweep.log").read_text()[-6000:]
    job_dir = sweep_dir / "0"
    record = summary(job_dir)
    assert record["status"] == "ok" and record["global_step"] == STEPS, record["error"]
    assert record["devices"] == ranks
    first, second = record["attempts"]
    assert first["ended"] == "requeued" and second["ended"] == "ok", record["attempts"]
    assert 2 <= first["at_step"] == second["from_step"] < STEPS, record["attempts"]
    assert first["nodes"] == second["nodes"] == ["node0", "node1"]
    for step in (first["at_step"], STEPS):  # sharded: every rank wrote its own file
        checkpoint = job_dir / "checkpoints" / f"step-{step:08d}.ckpt"
        assert sorted(p.name for p in checkpoint.glob("*.distcp")) == [
            f"__{rank}_0.distcp" for rank in range(ranks)
        ]
    files = sorted((job_dir / "wandb").glob("*run-*-*/*.wandb"))
    rows = [r for f in files for r in wandb_files.read_history(f) if "train/loss" in r]
    assert sorted(r["trainer/global_step"] for r in rows) == list(range(1, STEPS + 1))
    if (sharding, devices) == ("full", 1):
        _, ddp = two_nodes_one_task_each
        losses = [h["train/loss"] for h in record["history"]]
        assert losses == pytest.approx([h["train/loss"] for h in ddp["history"]], rel=1e-9)
