"""kiln-train decides the intra-op threads of every rank (``trainer.threads_per_rank``), records
them in the job's ``machine`` block (summary.json and the W&B run) and in each checkpoint, warns
when a resume computes with another count, and kiln-report does not divide the times of runs on
other counts."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from train_helpers import FAST, compose_train, explain, run_train, summary

from kiln.core.checkpoints.load import read_checkpoint_meta
from kiln.core.distributed.threads import default_threads_per_rank
from kiln.experiments.report.comparable import verdict
from kiln.experiments.tracking.wandb_files import find_run_files, read_run

ARGS = [*FAST, "trainer.progress=false", "trainer.checkpoint_every_n_steps=2"]


@pytest.fixture(scope="module")
def attempts(tmp_path_factory) -> tuple[Path, dict[str, Any], dict[str, Any], str]:
    """One job: 4 steps on the default count, then re-run to 6 steps on one thread per rank.
    Returns its directory, both attempts' records and the second one's stderr."""
    log_dir = tmp_path_factory.mktemp("threads")
    job_dir = log_dir / "job"
    first = run_train([*ARGS, f"hydra.run.dir={job_dir}"], log_dir)
    assert first.returncode == 0, explain(first)
    record = summary(job_dir)
    more = ["trainer.max_steps=6", "trainer.threads_per_rank=1", f"hydra.run.dir={job_dir}"]
    second = run_train([*ARGS, *more], log_dir)
    assert second.returncode == 0, explain(second)
    return job_dir, record, summary(job_dir), second.stderr


def test_the_job_records_the_default_count_its_ranks_computed_with(attempts):
    job_dir, first, _, _ = attempts
    expected = default_threads_per_rank(1, 1)
    assert first["machine"]["threads_per_rank"] == expected
    assert (
        read_checkpoint_meta(job_dir / "checkpoints" / "step-00000004.ckpt")["threads_per_rank"]
        == expected
    )


def test_an_explicit_count_is_what_the_ranks_compute_with_and_what_is_recorded(attempts):
    job_dir, _, second, _ = attempts
    assert second["status"] == "ok" and second["global_step"] == 6
    assert second["machine"]["threads_per_rank"] == 1
    # the checkpoint holds the count fit computed with (torch's, not the config's)
    assert read_checkpoint_meta(job_dir / second["checkpoint"])["threads_per_rank"] == 1
    last = sorted(find_run_files(job_dir))[-1]  # the second attempt's file of the one W&B run
    config = read_run(last)["config"]
    assert config["machine"]["threads_per_rank"] == 1


def test_a_resume_on_another_count_goes_on_with_a_warning_naming_both(attempts):
    _, first, _, stderr = attempts
    before = first["machine"]["threads_per_rank"]
    if before == 1:
        pytest.skip("one usable core: the default is already one thread per rank")
    assert f"trained with {before} intra-op thread(s) per rank, this job computes with 1" in (
        stderr
    ), stderr[-3000:]
    assert f"set trainer.threads_per_rank={before} to keep" in stderr


def test_kiln_report_takes_runs_on_other_counts_as_confounded(attempts):
    _, first, _, _ = attempts
    # the same machine otherwise (a busy machine's calibrations may confound it too)
    assert "threads per rank" not in (verdict(first, first) or "")
    other = copy.deepcopy(first)
    count = first["machine"]["threads_per_rank"]
    other["machine"]["threads_per_rank"] = count + 1
    said = verdict(other, first) or ""
    assert said.startswith(f"confounded: other threads per rank ({count + 1} vs {count})"), said


def test_a_bad_count_fails_in_the_config_stage(tmp_path):
    proc = run_train([*ARGS, "trainer.threads_per_rank=0", f"hydra.run.dir={tmp_path}"], tmp_path)
    assert proc.returncode != 0
    record = summary(tmp_path)
    assert record["error_stage"] == "config", record
    assert "trainer.threads_per_rank=0 is not valid; use an integer >= 1" in record["error"]
    assert not (tmp_path / "wandb").exists() and not (tmp_path / "checkpoints").exists()


def test_a_scaling_ratio_compares_the_threads_per_rank_or_on_a_node(attempts):
    """1 rank x 2 threads against 2 ranks x 1 (the default on 2 cores: the same cores) is a
    scaling result, and so is 1 x 1 against 2 x 1 (the same threads per rank); 1 x 1 against
    2 x 2 is neither."""
    _, first, _, _ = attempts

    def run(devices: int, threads: int) -> dict[str, Any]:
        record = copy.deepcopy(first)
        record["config"]["trainer"]["devices"] = devices
        record["machine"]["threads_per_rank"] = threads
        return record

    assert "threads" not in (verdict(run(2, 1), run(1, 2)) or "")
    assert "threads" not in (verdict(run(2, 1), run(1, 1)) or "")
    said = verdict(run(2, 2), run(1, 1)) or ""
    assert said.startswith("confounded: other threads per rank (2 vs 1; per node 4 vs 1)"), said


@pytest.mark.parametrize(("value", "expected"), [("auto", "auto"), ("null", None), ("3", 3)])
def test_the_key_composes_through_the_structured_config(value, expected):
    assert compose_train([f"trainer.threads_per_rank={value}"]).trainer.threads_per_rank == expected
