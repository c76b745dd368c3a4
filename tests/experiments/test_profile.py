"""kiln-train profile=steps: a Perfetto trace in the job dir, where a step's time goes in
summary.json and the W&B run, and the trace as the run's artifact."""

from __future__ import annotations

import json

import pytest
from train_helpers import FAST, job_dirs, run_train

from kiln.core.telemetry.profile import ORDER
from kiln.experiments.tracking.wandb_files import read_records, read_summary


def test_kiln_train_profile_steps_keeps_a_trace_and_a_breakdown_and_logs_them(tmp_path):
    args = [*FAST, "trainer.max_steps=7", "profile=steps", "profile.active=2", "logger=wandb"]
    proc = run_train(args, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (job,) = job_dirs(tmp_path)
    profile = json.loads((job / "summary.json").read_text())["profile"]
    assert profile["trace"] == str(job / "profile" / "trace.json")
    assert profile["steps"] == [5, 6]  # after wait 2 and warmup 2
    events = json.loads((job / "profile" / "trace.json").read_text())["traceEvents"]
    assert sum(e.get("name", "").startswith("ProfilerStep#") for e in events) == 2
    found = profile["breakdown"]
    assert list(found["host_ms"]) == [c for c in ORDER if c in found["host_ms"]]
    assert sum(found["host_ms"].values()) == pytest.approx(found["step_ms"])
    assert found["host_ms"]["matmul and linear"] > 0 and found["ops_per_step"] > 0
    # the W&B run: the breakdown in its summary, the trace folder as an artifact
    summary = read_summary(job)
    assert summary["profile/breakdown/step_ms"] == found["step_ms"]
    assert profile["wandb_artifact"].startswith("profile-")
    assert any(r["type"] == "artifact" for r in read_records(job))


def test_profiling_is_off_by_default(tmp_path):
    proc = run_train([*FAST, "logger=csv"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (job,) = job_dirs(tmp_path)
    assert json.loads((job / "summary.json").read_text())["profile"] is None
    assert not (job / "profile").exists()
