"""A kiln-train job killed mid-run and re-run into its directory: it resumes from its own
checkpoint, continues its one W&B run with one row per step, and lists its attempts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from train_helpers import (
    FAST,
    checkpointed_steps,
    explain,
    job_dirs,
    run_train,
    start_train,
    summary,
    user_env,
    wait_until,
)

from kiln.experiments.tracking.wandb_files import read_history, read_run

STEPS = 30
ARGS = [
    *FAST,
    f"trainer.max_steps={STEPS}",
    "trainer.checkpoint_every_n_steps=5",
    "trainer.log_every_n_steps=1",
]


def _start(
    job_dir: Path, log_dir: Path, name: str, extra: tuple = (), group: bool = False
) -> tuple[subprocess.Popen, Path]:
    """:func:`train_helpers.start_train` with this module's ``ARGS`` and ``extra``."""
    return start_train([*ARGS, *extra], job_dir, log_dir, name, group)


def _start_and_stop(
    job_dir: Path,
    log_dir: Path,
    sig: int,
    ready: Callable[[str], bool],
    extra: tuple = (),
    group: bool = False,
) -> int:
    """Start kiln-train into ``job_dir``; send ``sig`` once ``ready(its output so far)``, to
    its whole process group if ``group`` (as a terminal's Ctrl-C does)."""
    proc, out = _start(job_dir, log_dir, signal.Signals(sig).name, extra, group)
    wait_until(proc, out, ready)
    if group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    proc.wait(timeout=300)
    assert max(checkpointed_steps(job_dir)) < STEPS, "the run finished before the signal"
    return proc.returncode


@pytest.fixture(scope="module")
def killed_twice(tmp_path_factory):
    """A job SIGKILLed after a checkpoint; re-run with checkpoints every 1000 steps and
    SIGTERMed two steps after its resume; re-run to the end. And the job uninterrupted."""
    log_dir = tmp_path_factory.mktemp("resume")
    job_dir = log_dir / "job"
    killed = _start_and_stop(
        job_dir, log_dir, signal.SIGKILL, lambda _: bool(checkpointed_steps(job_dir))
    )
    after = max(checkpointed_steps(job_dir)) + 2  # progress prints "step N/30 ..."
    terminated = _start_and_stop(
        job_dir,
        log_dir,
        signal.SIGTERM,
        lambda out: f"step {after}/" in out,
        ("trainer.checkpoint_every_n_steps=1000",),
    )
    terminated_summary = summary(job_dir)
    proc = run_train([*ARGS, f"hydra.run.dir={job_dir}"], log_dir)
    plain = run_train([*ARGS, f"hydra.run.dir={log_dir / 'plain'}"], log_dir)
    assert plain.returncode == 0, explain(plain)
    return job_dir, killed, terminated, terminated_summary, proc, summary(log_dir / "plain")


@pytest.mark.process
def test_sigterm_exits_143_and_is_recorded(killed_twice) -> None:
    _, killed, terminated, record, *_ = killed_twice
    assert killed == -signal.SIGKILL
    assert terminated == 143
    assert (record["status"], record["error"]) == ("stopped", None)  # not failed: resumable
    assert (record["stop_reason"], record["stop_signal"]) == ("signal", "SIGTERM")
    assert [a["ended"] for a in record["attempts"]] == ["killed", "SIGTERM"]


@pytest.mark.process
def test_a_stopped_job_reads_stopped_in_the_report_and_fails_its_sweep(
    killed_twice, tmp_path, capsys
) -> None:
    """What reads ``status`` takes ``stopped``: kiln-report lists the job with it, and a
    sweep that holds it is not done (exit 1)."""
    import csv

    from omegaconf import OmegaConf

    from kiln.experiments.jobs.hydra_callbacks import SweepStatus
    from kiln.experiments.report.cli import build_report
    from kiln.experiments.settings.job_files import write_job_json

    stopped = killed_twice[3]
    (tmp_path / "0" / ".hydra").mkdir(parents=True)
    (tmp_path / "0" / ".hydra" / "config.yaml").write_text("{}")
    write_job_json(tmp_path / "0" / "summary.json", stopped)
    build_report(tmp_path, show=False)
    with (tmp_path / "train_runs.csv").open() as handle:
        (row,) = csv.DictReader(handle)
    assert (row["status"], row["global_step"]) == ("stopped", str(stopped["global_step"]))
    with pytest.raises(SystemExit) as info:
        SweepStatus().on_multirun_end(
            OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
        )
    assert info.value.code == 1 and "1 of 1 jobs failed: 0" in capsys.readouterr().err


@pytest.mark.process
def test_sigterm_checkpoints_at_its_step_and_the_resume_is_exact(killed_twice) -> None:
    """SIGTERM stops the run at the next step boundary with a checkpoint there (none was due:
    every 1000 steps), and the re-run resumes from it to the end of an uninterrupted run."""
    job_dir, _, _, terminated, proc, plain = killed_twice
    stopped = terminated["attempts"][-1]
    assert stopped["from_step"] + 2 <= stopped["at_step"] == terminated["global_step"]
    # relative to the job directory: a moved job reads its own
    assert terminated["checkpoint"] == f"checkpoints/step-{stopped['at_step']:08d}.ckpt"
    assert proc.returncode == 0, explain(proc)
    record = summary(job_dir)
    assert record["attempts"][-1]["from_step"] == stopped["at_step"]
    assert record["history"] == plain["history"]  # every loss, lr and grad norm, bit for bit
    assert record["metrics"] == plain["metrics"]


@pytest.mark.process
def test_ctrl_c_on_two_devices_stops_both_workers_at_a_step_with_a_checkpoint(tmp_path) -> None:
    """A terminal's Ctrl-C reaches the job's process group; torch's agent relays it to the
    workers, which stop at one step boundary, at once, and hand their result back to the
    record. The re-run resumes there to the end."""
    job_dir = tmp_path / "job"
    two = ("trainer.devices=2", "trainer.checkpoint_every_n_steps=1000")
    code = _start_and_stop(job_dir, tmp_path, signal.SIGINT, lambda o: "step 3/" in o, two, True)
    assert code == -signal.SIGINT  # KeyboardInterrupt, as on one device
    record = summary(job_dir)
    stopped = record["attempts"][-1]
    assert (record["status"], stopped["ended"]) == ("stopped", "SIGINT")
    assert 3 <= stopped["at_step"] == record["global_step"] < STEPS
    assert record["checkpoint"] == f"checkpoints/step-{stopped['at_step']:08d}.ckpt"
    assert (job_dir / record["checkpoint"] / "meta.pt").is_file()
    # no worker was left waiting for the agent's kill (torch: "... forcefully exiting via 9")
    assert "forcefully" not in (tmp_path / "attempt-SIGINT.log").read_text()
    proc = run_train([*ARGS, *two, f"hydra.run.dir={job_dir}"], tmp_path, process=True)
    assert proc.returncode == 0, explain(proc)
    record = summary(job_dir)
    assert record["attempts"][-1]["from_step"] == stopped["at_step"]
    assert [row["step"] for row in record["history"]] == list(range(1, STEPS + 1))


@pytest.mark.process
def test_a_killed_two_device_job_leaves_a_checkpoint_and_no_worker(tmp_path) -> None:
    """SIGKILL to the job's process: torch's parent-death signal (one SIGINT per exiting
    thread of the killed process) stops its workers at one step boundary with a checkpoint
    there, and they end; none trains on, orphaned (the repeats once killed them mid-save, and
    so did rank 0's W&B logging into the killed job's W&B service; on a loaded machine a
    signal that came while a rank waited in the stop poll's all-reduce was erased by its
    answer, and the ranks trained on: ``test_stop.py`` has that case alone)."""
    out, workers_ended = _kill_a_two_device_job(tmp_path / "job", tmp_path / "log")
    assert workers_ended, f"workers still running after their job was killed: {out}"
    steps = checkpointed_steps(tmp_path / "job")
    assert steps, out.read_text()[-4000:]
    (step,) = steps
    assert 3 <= step < STEPS, out.read_text()[-4000:]
    assert (tmp_path / "job" / "checkpoints" / f"step-{step:08d}.ckpt" / "meta.pt").is_file()


def _kill_a_two_device_job(job_dir: Path, log_dir: Path) -> tuple[Path, bool]:
    """SIGKILL a two-device job at its third step; its output, and whether its workers
    ended by themselves within 2 minutes (those that did not are killed)."""
    import psutil

    log_dir.mkdir()
    two = ("trainer.devices=2", "trainer.checkpoint_every_n_steps=1000")
    proc, out = _start(job_dir, log_dir, "SIGKILL", two)
    wait_until(proc, out, lambda o: "step 3/" in o)
    children = psutil.Process(proc.pid).children(recursive=True)
    workers = [p for p in children if "spawn_main" in " ".join(p.cmdline())]  # not W&B's
    assert len(workers) == 2, [p.cmdline() for p in children]
    wandb = [p for p in children if "wandb" in " ".join(p.cmdline())]
    proc.kill()
    for service in wandb:  # it ends with its parent anyway: now, before the workers log
        service.kill()
    proc.wait()
    _, alive = psutil.wait_procs(workers, timeout=120)
    for worker in alive:
        worker.kill()
    return out, not alive


@pytest.mark.process
def test_resumed_job_keeps_full_history_and_attempts(killed_twice) -> None:
    job_dir, _, _, _, proc, _ = killed_twice
    assert proc.returncode == 0, explain(proc)
    record = summary(job_dir)
    assert record["status"] == "ok"
    assert record["global_step"] == STEPS
    assert [row["step"] for row in record["history"]] == list(range(1, STEPS + 1))
    attempts = record["attempts"]
    assert [a["ended"] for a in attempts] == ["killed", "SIGTERM", "ok"]
    assert (record["stop_reason"], record["stop_signal"]) == ("max_steps", None)
    assert attempts[0]["from_step"] == 0
    assert 0 < attempts[1]["from_step"] < attempts[2]["from_step"] < STEPS
    assert attempts[1]["from_step"] % 5 == 0  # the SIGKILLed attempt's periodic checkpoint


@pytest.mark.process
def test_one_wandb_run_with_one_row_per_step(killed_twice) -> None:
    job_dir, *_ = killed_twice
    run_id = (job_dir / "wandb_run_id").read_text().strip()
    files = sorted((job_dir / "wandb").glob("*run-*-*/*.wandb"))  # not latest-run
    assert len(files) == 3, files  # one file per attempt, all of one run
    # A SIGKILLed attempt's W&B process may die before it writes a record (its file is a
    # bare header); its rows come back from the checkpoint's history in the next attempt.
    runs = [read_run(f) for f in files]
    assert {run["id"] for run in runs if run} == {run_id}
    assert runs[-1], "the attempt that finished wrote no run record"
    assert summary(job_dir)["wandb"]["run_id"] == run_id
    steps = [
        row["trainer/global_step"] for f in files for row in read_history(f) if "train/loss" in row
    ]
    assert sorted(steps) == list(range(1, STEPS + 1))


@pytest.mark.process
def test_wandb_files_reads_every_attempt_of_the_resumed_job_as_one_history(killed_twice) -> None:
    """``python -m kiln.experiments.tracking.wandb_files <job dir> --history``: the run's
    info, its final summary and every step's row once, over the job's three attempts."""
    job_dir, *_ = killed_twice
    proc = subprocess.run(
        [sys.executable, "-m", "kiln.experiments.tracking.wandb_files", str(job_dir), "--history"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    decoder, text, docs = json.JSONDecoder(), proc.stdout, []
    while text.strip():
        doc, end = decoder.raw_decode(text.lstrip())
        docs.append(doc)
        text = text.lstrip()[end:]
    info, wandb_summary, *rows = docs
    assert info["id"] == (job_dir / "wandb_run_id").read_text().strip()
    assert info["attempts"] == 3 and info["exit_code"] == 0
    assert wandb_summary["status"] == "ok" and wandb_summary["global_step"] == STEPS
    steps = [row["trainer/global_step"] for row in rows if "train/loss" in row]
    assert steps == list(range(1, STEPS + 1))


@pytest.mark.process
def test_resume_refuses_a_changed_model_seed_or_optimizer(killed_twice) -> None:
    job_dir, *_, proc, _ = killed_twice
    assert proc.returncode == 0, explain(proc)
    changed = [*ARGS, "trainer.seed=1", "optimizer.lr=0.01", f"hydra.run.dir={job_dir}"]
    before = summary(job_dir)
    proc = run_train(changed, job_dir.parent)
    assert proc.returncode == 1, explain(proc)
    assert summary(job_dir) == before  # the finished job's record stays, attempts and all
    said = f"{job_dir}: refused, its record stays as it was: "
    error = next(line for line in proc.stderr.splitlines() if line.startswith(said))
    assert "ResumeConfigError" in error, error  # the config stage's refusal
    assert "trainer.seed: 0 -> 1" in error and "optimizer.lr: 0.001 -> 0.01" in error, error


def test_unwritable_checkpoint_dir_fails_in_the_config_stage(tmp_path) -> None:
    proc = run_train([*FAST, "trainer.checkpoint_dir=/proc/kiln-checkpoints"], tmp_path)
    assert proc.returncode == 1, explain(proc)
    record = summary(job_dirs(tmp_path)[0])
    assert (record["status"], record["error_stage"]) == ("failed", "config")
    assert "trainer.checkpoint_dir='/proc/kiln-checkpoints' is not writable" in record["error"]
    assert record["global_step"] == 0 and record["wandb"] is None


@pytest.mark.slow
def test_rerun_sweep_skips_finished_jobs_and_resumes_the_killed_one(tmp_path) -> None:
    from kiln.experiments.report.cli import build_report

    sweep_dir = tmp_path / "sweep"
    args = ["-m", *ARGS, "trainer.seed=0,1", f"hydra.sweep.dir={sweep_dir}"]
    env = {**user_env(), "KILN_LOG_DIR": str(tmp_path), "WANDB_MODE": "offline"}
    cmd = [sys.executable, "-m", "kiln.experiments.train", *args]
    first = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 900
    while not checkpointed_steps(sweep_dir / "1"):  # job 0 is done, job 1 has a checkpoint
        assert first.poll() is None and time.monotonic() < deadline, "job 1 never checkpointed"
        time.sleep(0.05)
    first.kill()
    first.wait(timeout=300)
    job0 = summary(sweep_dir / "0")
    assert job0["status"] == "ok" and not (sweep_dir / "1" / "summary.json").exists()

    proc = run_train(args, tmp_path)
    assert proc.returncode == 0, explain(proc)
    assert summary(sweep_dir / "0") == job0  # skipped: its record is untouched
    job1 = summary(sweep_dir / "1")
    assert job1["status"] == "ok"
    assert [a["ended"] for a in job1["attempts"]] == ["killed", "ok"]
    assert job1["attempts"][1]["from_step"] > 0
    assert [row["step"] for row in job1["history"]] == list(range(1, STEPS + 1))
    records = build_report(sweep_dir, show=False)["records"]
    assert sorted(r["job_num"] for r in records) == [0, 1]
