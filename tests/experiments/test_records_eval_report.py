"""What a job's own table, kiln-eval and kiln-report say, early and on the terminal: the
share of the measured matmul peak beside MFU, a batch limit below 1 refused by name, a switch
for generation, and a corrupt record named on the terminal."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from export_helpers import kiln
from train_helpers import FAST, explain, job_dirs, run_train, summary

WIDE = {"COLUMNS": "200"}


@pytest.fixture(scope="module")
def seq2seq(tmp_path_factory) -> tuple[Path, str]:
    log_dir = tmp_path_factory.mktemp("seq2seq")
    proc = run_train(
        ["model=t5-tiny-seq2seq", "data=reverse", *FAST,
         "trainer.checkpoint_dir=${paths.output_dir}/checkpoints"],
        log_dir,
        env=WIDE,
    )  # fmt: skip
    assert proc.returncode == 0, explain(proc)
    (job,) = job_dirs(log_dir)
    return job, proc.stdout


def test_the_jobs_table_and_record_give_the_share_of_the_measured_peak(seq2seq):
    job, stdout = seq2seq
    record = summary(job)
    share = record["telemetry"]["of_measured_peak"]
    assert 0 < share < 1, share
    assert record["telemetry"]["mfu"] is None  # the CPU: no datasheet peak
    peak = record["machine"]["matmul_peak"]["matmul_peak_gflop_per_s"]
    (row,) = [line for line in stdout.splitlines() if "of measured peak" in line]
    assert f"{share:.1%} of {peak:.4g} GFLOP/s" in row, stdout


@pytest.mark.parametrize("limit", ["0", "-1"])
def test_kiln_eval_refuses_a_batch_limit_below_one(seq2seq, limit):
    job, _ = seq2seq
    proc = kiln("eval", job, "--limit-batches", limit, "--wandb-mode", "disabled")
    assert proc.returncode == 2, explain(proc)
    assert f"--limit-batches={limit} is not valid: give a number of batches >= 1" in proc.stderr
    assert "KeyError" not in proc.stdout + proc.stderr


def test_kiln_eval_generates_unless_told_not_to(seq2seq, tmp_path):
    job, _ = seq2seq
    common = ["--limit-batches", "1", "--wandb-mode", "disabled"]
    proc = kiln("eval", job, *common, "--no-generate", "--out", tmp_path / "plain.json")
    assert proc.returncode == 0, explain(proc)
    plain = json.loads((tmp_path / "plain.json").read_text())
    assert plain["generate"] is False
    assert "val/exact_match" in plain["metrics"]
    assert not any("generated_" in k for k in plain["metrics"]), plain["metrics"]
    proc = kiln("eval", job, *common, "--out", tmp_path / "generated.json")
    assert proc.returncode == 0, explain(proc)
    generated = json.loads((tmp_path / "generated.json").read_text())["metrics"]
    assert "val/generated_exact_match" in generated


def test_kiln_report_names_a_corrupt_record_on_the_terminal(seq2seq, tmp_path):
    job, _ = seq2seq
    sweep = tmp_path / "sweep"
    shutil.copytree(job, sweep / "0", ignore=shutil.ignore_patterns("checkpoints", "wandb"))
    (sweep / "1").mkdir()
    (sweep / "1" / "summary.json").write_text('{"status": "ok", "global_')  # cut short
    proc = kiln("report", sweep, "--quiet")
    assert proc.returncode == 0, explain(proc)
    assert f"unreadable job file: {sweep / '1' / 'summary.json'}" in proc.stderr, explain(proc)
    shutil.rmtree(sweep / "0")  # nothing else to report: the error names it too
    proc = kiln("report", sweep, "--quiet")
    assert proc.returncode == 2, explain(proc)
    assert f"unreadable: {sweep / '1' / 'summary.json'}" in proc.stderr, explain(proc)
