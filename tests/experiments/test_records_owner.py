"""A job's directory has one writer, the run that trains it: a run refused in an earlier
job's directory, or one that finds nothing to do there, changes none of its bytes (Hydra's
``.hydra`` files, the sweep's ``multirun.yaml``, ``attempts.json``, the log, the W&B run);
Hydra's files describe the run that trained the job; a sweep with a refused job exits
non-zero and names it. (``job.lock`` is the lock, not the record: whoever holds it names
itself there.)"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml
from train_helpers import FAST, explain, run_train, summary

ARGS = [*FAST, "trainer.max_steps=2", "trainer.log_every_n_steps=1"]


def _bytes(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` by its relative path, but the lock and W&B's service's debug
    logs (the service of the earlier run may still be appending its last lines; the W&B run
    itself is its ``.wandb`` file)."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "job.lock" and not p.match("wandb/*/logs/debug*.log")
    }


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    """One finished job (2 steps, its W&B run offline)."""
    root = tmp_path_factory.mktemp("owner")
    job_dir = root / "job"
    proc = run_train([*ARGS, f"hydra.run.dir={job_dir}"], root)
    assert proc.returncode == 0, explain(proc)
    return job_dir


def test_hydra_files_describe_the_run_that_trained_the_job(job):
    overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
    assert "trainer.max_steps=2" in overrides, overrides
    config = yaml.safe_load((job / ".hydra" / "config.yaml").read_text())
    assert config["trainer"]["max_steps"] == 2
    assert yaml.safe_load((job / ".hydra" / "hydra.yaml").read_text())["hydra"]["job"]
    assert (job / "train.log").is_file()


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (["trainer.max_steps=1"], "below the step this job resumes from"),
        (["optimizer.lr=0.5"], "optimizer.lr"),
    ],
    ids=["fewer-steps", "other-lr"],
)
def test_a_refused_run_changes_no_byte_of_the_job(job, change, error):
    before = _bytes(job)
    proc = run_train([*ARGS, *change, f"hydra.run.dir={job}"], job.parent)
    assert proc.returncode == 1, explain(proc)
    assert error in " ".join((proc.stdout + proc.stderr).split()), explain(proc)
    assert _bytes(job) == before
    assert summary(job)["status"] == "ok"


def test_a_skipped_rerun_changes_no_byte_of_the_job(job):
    before = _bytes(job)
    proc = run_train([*ARGS, f"hydra.run.dir={job}"], job.parent)
    assert proc.returncode == 0, explain(proc)
    assert "skipped" in proc.stdout, explain(proc)
    assert _bytes(job) == before


def test_a_sweep_refused_into_an_earlier_sweep_exits_non_zero_and_keeps_its_record(tmp_path):
    sweep = tmp_path / "sweep"
    args = [*FAST, "trainer.max_steps=1", "logger=none", f"hydra.sweep.dir={sweep}"]
    first = run_train(["-m", *args, "optimizer.lr=1e-3,2e-3"], tmp_path)
    assert first.returncode == 0, explain(first)
    before = _bytes(sweep)
    second = run_train(["-m", *args, "optimizer.lr=3e-3,4e-3"], tmp_path)
    assert second.returncode == 1, explain(second)
    said = " ".join(second.stderr.split())
    assert "job 0 refused" in said and "optimizer.lr: 0.001 -> 0.003" in said, explain(second)
    assert "job 1 refused" in said and "2 of 2 jobs failed" in said, explain(second)
    after = {k: v for k, v in _bytes(sweep).items() if not k.startswith(".refused")}
    assert after == before  # multirun.yaml and each job's .hydra describe the first sweep
    assert b"optimizer.lr=1e-3,2e-3" in after["multirun.yaml"]


def test_the_job_log_holds_lightnings_lines_whatever_was_imported_first(tmp_path, monkeypatch):
    # Lightning imported before logging is set up (by a script that imports it first, or a
    # test collection) gives its logger a handler of its own and stops it propagating
    fabric_logger = logging.getLogger("lightning.fabric")
    monkeypatch.setattr(fabric_logger, "propagate", False)
    monkeypatch.setattr(fabric_logger, "handlers", [logging.StreamHandler()])
    job = tmp_path / "J"
    proc = run_train([*ARGS, "logger=none", f"hydra.run.dir={job}"], tmp_path)
    assert proc.returncode == 0, explain(proc)
    assert "Seed set to" in (job / "train.log").read_text()
