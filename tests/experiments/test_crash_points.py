"""Crash points, systematic: a job killed (SIGKILL) or stopped (SIGTERM) at the first and the
last occurrence of every kind of write of its record, then re-run, ends with the record of an
uninterrupted run: checkpoint tensors, history, validation history, metrics, W&B rows (each
exactly once, one run id, an exit record), Hydra's files and attempts
(``tests/experiments/crash_points.py``; every occurrence: ``make test-crash``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from crash_points import Case, plan, point_kind

HERE = Path(__file__).parent


def test_the_plan_takes_the_first_and_last_of_each_kind_of_point():
    points = ["a", "b", "a", "c", "a"]
    cases = {(c.kind, c.occurrence, c.signal) for c in plan(points, every=False)}
    assert cases == {
        ("a", 1, "SIGKILL"), ("a", 3, "SIGKILL"), ("b", 1, "SIGKILL"), ("c", 1, "SIGKILL"),
        ("a", 3, "SIGTERM"), ("b", 1, "SIGTERM"), ("c", 1, "SIGTERM"),
    }  # fmt: skip
    assert len(plan(points, every=True)) == 2 * len(points)
    assert Case("a", 1, 3, "SIGKILL").name == "a#1/3-SIGKILL"


def test_point_kinds_are_paths_in_the_job_with_steps_as_stars(tmp_path):
    job = tmp_path / "job"
    assert point_kind(job / "checkpoints" / "step-00000004.ckpt", job) == "checkpoints/step-*.ckpt"
    assert point_kind(job / ".hydra" / "config.yaml", job) == ".hydra/config.yaml"
    assert point_kind(tmp_path / "elsewhere.json", job) is None


@pytest.mark.process
def test_a_job_killed_at_any_kind_of_write_ends_with_the_uninterrupted_record(tmp_path):
    out = tmp_path / "crash"
    proc = subprocess.run(
        [sys.executable, str(HERE / "crash_points.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    print(proc.stdout[-6000:])  # the table, in the test log
    results = json.loads((out / "results.json").read_text())
    kinds = set(results["points"])
    # the record's writers, as the reference run went through them
    writers = {"summary.json", "attempts.json", ".hydra/config.yaml", "checkpoints/run.json"}
    writers |= {"checkpoints/step-*.ckpt", "wandb:train", "wandb:validation", "wandb:finish"}
    assert writers <= kinds, sorted(kinds)
    covered = {c["kind"] for c in results["cases"]}
    assert covered == kinds
    bad = [f"{c['name']}: {c['problems']}" for c in results["cases"] if c["problems"]]
    assert not bad, "\n".join(bad) + "\n" + proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]
