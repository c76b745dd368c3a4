"""A requeue that SLURM refuses (a ``PreemptMode=CANCEL`` partition with ``--no-requeue``:
"Requested operation is presently disabled") is recorded as what happened: the job failed,
its attempt did not end ``requeued``, and both carry scontrol's reason."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from kiln.experiments.jobs.lifecycle import Requeued
from kiln.experiments.launchers.slurm import RequeueRefused, requeue_job
from kiln.experiments.settings.job_info import JobInfo
from kiln.experiments.train.rerun import begin_attempt, end_attempt
from kiln.experiments.train.train_job import _requeue

REFUSAL = "scontrol: error: Requested operation is presently disabled for job 123"


@pytest.fixture
def refusing_scontrol(tmp_path: Path, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f"#!/bin/sh\necho '{REFUSAL}' >&2\nexit 1\n")
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path('/usr/bin')}:{Path('/bin')}")


def test_a_refused_requeue_keeps_scontrols_reason(refusing_scontrol) -> None:
    with pytest.raises(RequeueRefused, match="scontrol requeue 123 was refused: scontrol: error"):
        requeue_job("123", 1)


def test_a_refused_requeue_is_recorded_as_a_failure_with_the_reason(
    refusing_scontrol, tmp_path: Path
) -> None:
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    attempts = begin_attempt(str(job_dir))
    end_attempt(str(job_dir), attempts, "requeued", 4)  # as the attempt's end wrote it
    record = {"status": "requeued", "global_step": 4, "attempts": attempts}

    def submitits_handler(signum, frame):  # what guard_requeue makes of submitit's
        requeue_job("123", 1)

    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM)}
    signal.signal(signal.SIGUSR2, submitits_handler)
    try:
        with pytest.raises(RequeueRefused):
            _requeue(JobInfo(output_dir=str(job_dir)), Requeued(record, "SIGTERM"))
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    summary = json.loads((job_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["error"].startswith("stopped by SIGTERM with a checkpoint, not requeued: ")
    assert REFUSAL in summary["error"]
    (attempt,) = json.loads((job_dir / "attempts.json").read_text())
    assert attempt["ended"] == "failed" and REFUSAL in attempt["error"]
