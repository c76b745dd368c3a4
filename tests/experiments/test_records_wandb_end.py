"""A job SIGKILLed right after its final ``summary.json`` write leaves its W&B run without
an exit record, and without the rows its W&B process had not written yet; a re-run of the
finished job logs exactly the rows the run lacks and finishes it (and only that once)."""

from __future__ import annotations

import signal
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from in_process import user_env
from train_helpers import FAST, explain, run_train, summary

from kiln.experiments.tracking.tracker import FINISHED_FILE, STEP_METRIC
from kiln.experiments.tracking.wandb_files import read_history, read_run, read_summary, row_kind

HERE = Path(__file__).resolve().parent

BLOCK = 32768  # a .wandb file is a leveldb-style log: 32 KiB blocks of chunked records
HEADER = 7  # ":W&B" and the format version


def cut_at_exit(run_file: Path) -> None:
    """Truncate ``run_file`` where its exit record starts: what a kill between the job's
    record and its run's end leaves."""
    cut_before(run_file, "exit")


def cut_before(run_file: Path, kind: str, skip: int = 0) -> None:
    """Truncate ``run_file`` where its record of type ``kind`` (``exit``, ``history``) after
    the first ``skip`` ones starts."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = run_file.read_bytes()
    pos, start, record = HEADER, HEADER, b""
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a chunk header
            pos += BLOCK - pos % BLOCK
            continue
        _, length, chunk = struct.unpack("<IHB", data[pos : pos + 7])
        if chunk in (1, 2):  # a full record, or a record's first chunk
            start, record = pos, b""
        record += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if chunk in (1, 4):  # a record ends
            parsed = pb.Record()  # pyright: ignore[reportAttributeAccessIssue]
            parsed.ParseFromString(record)
            if parsed.WhichOneof("record_type") == kind:
                if skip == 0:
                    run_file.write_bytes(data[:start])
                    return
                skip -= 1
    raise AssertionError(f"{run_file} holds no {kind} record to cut at")


def metrics(row: dict[str, Any]) -> dict[str, Any]:
    """A row's metrics: without its step (the record's ``step``, W&B's ``trainer/global_step``)
    and W&B's own ``_step``, ``_runtime``, ``_timestamp``."""
    return {k: v for k, v in row.items() if k not in ("step", STEP_METRIC) and k[0] != "_"}


def assert_rows_equal(job_dir: Path, record: dict[str, Any]) -> None:
    """The job's W&B run holds each training and validation row of ``record``'s history once
    (by kind and step), with the record's values, and no other row."""
    rows = [*record["history"], *record["validation_history"]]
    logged: dict[tuple[str, int], dict[str, Any]] = {}
    counts: Counter[tuple[str, int]] = Counter()
    for row in read_history(job_dir):
        if STEP_METRIC in row:
            key = (row_kind(metrics(row)), int(row[STEP_METRIC]))
            counts[key] += 1
            logged[key] = row
    expected = {(row_kind(metrics(row)), row["step"]): row for row in rows}
    assert counts == Counter(expected.keys()), counts
    for key, row in expected.items():
        got = logged[key]
        assert {k: got[k] for k in metrics(row)} == pytest.approx(metrics(row)), (row, got)


def test_a_rerun_finishes_the_wandb_run_a_kill_left_open(tmp_path):
    job_dir = tmp_path / "job"
    args = [*FAST, f"hydra.run.dir={job_dir}"]
    proc = run_train(args, tmp_path)
    assert proc.returncode == 0, explain(proc)
    (run_file,) = job_dir.glob("wandb/offline-run-*/run-*.wandb")
    cut_at_exit(run_file)
    (job_dir / FINISHED_FILE).unlink()  # written after the run's end: the kill came first
    assert "exit_code" not in read_run(job_dir)
    before = summary(job_dir)

    proc = run_train(args, tmp_path)
    assert proc.returncode == 0, explain(proc)
    assert "skipped" in proc.stdout and "finished it now" in proc.stdout, explain(proc)
    assert read_run(job_dir)["exit_code"] == 0
    assert read_summary(job_dir)["global_step"] == before["global_step"]
    assert summary(job_dir) == before
    assert_rows_equal(job_dir, before)  # the rows it held, none twice

    again = run_train(args, tmp_path)  # finished: nothing more to do
    assert "finished it now" not in again.stdout, explain(again)
    assert len(list(job_dir.glob("wandb/offline-run-*/run-*.wandb"))) == 2


def test_a_rerun_logs_the_rows_the_wandb_run_lacks(tmp_path):
    """The run's file holds the first two training rows only (a kill before W&B's process
    wrote the rest): the re-run of the finished job logs steps 3 and 4 and the validation
    row, each once, and ends the run."""
    job_dir = tmp_path / "job"
    args = [*FAST, f"hydra.run.dir={job_dir}", "trainer.log_every_n_steps=1"]
    proc = run_train(args, tmp_path)
    assert proc.returncode == 0, explain(proc)
    (run_file,) = job_dir.glob("wandb/offline-run-*/run-*.wandb")
    cut_before(run_file, "history", skip=2)
    (job_dir / FINISHED_FILE).unlink()
    before = summary(job_dir)
    assert len(before["history"]) == 4 and len(before["validation_history"]) == 1

    proc = run_train(args, tmp_path)
    assert proc.returncode == 0, explain(proc)
    assert_rows_equal(job_dir, before)
    assert "skipped" in proc.stdout and "logged the 3 missing row(s)" in proc.stdout, explain(proc)
    assert read_run(job_dir)["exit_code"] == 0
    assert summary(job_dir) == before


def end_after_record(
    tmp_path: Path, end: str, sweep: list[str] | None = None
) -> tuple[Path, list[str], Any]:
    """``kiln-train`` (4 steps, a row each) into ``<tmp_path>/job``, ended right after its
    final ``summary.json`` write (``kill_after_record.py``: ``sigkill``, or ``sigterm`` to W&B's
    service and the job); returns the job dir, its arguments and the ended process.
    ``sweep``: a sweep's overrides instead (``-m``, into ``<tmp_path>/job``: its job ``0``)."""
    job_dir = tmp_path / "job"
    args = [*FAST, f"hydra.run.dir={job_dir}", "trainer.log_every_n_steps=1"]
    if sweep is not None:
        args = ["-m", *FAST, f"hydra.sweep.dir={job_dir}", "trainer.log_every_n_steps=1", *sweep]
        job_dir = job_dir / "0"
    env = {**user_env(), "KILN_LOG_DIR": str(tmp_path), "WANDB_MODE": "offline", "KILN_END": end}
    ended = subprocess.run(
        [sys.executable, str(HERE / "kill_after_record.py"), *args],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    return job_dir, args, ended


@pytest.mark.process
def test_a_sigkill_after_the_record_loses_no_wandb_row(tmp_path):
    """The reporter's case: SIGKILL right after the final ``summary.json`` write (W&B's
    process, left alone, wrote none of the rows: a 7-byte file); the same command again
    skips the finished job and leaves its run with every row of the record, once."""
    job_dir, args, killed = end_after_record(tmp_path, "sigkill")
    assert killed.returncode == -signal.SIGKILL, explain(killed)
    before = summary(job_dir)
    assert before["status"] == "ok", explain(killed)
    assert "exit_code" not in read_run(job_dir)

    proc = run_train(args, tmp_path)
    assert proc.returncode == 0, explain(proc)
    assert "skipped" in proc.stdout and "finished it now" in proc.stdout, explain(proc)
    assert read_run(job_dir)["exit_code"] == 0
    assert summary(job_dir) == before
    assert_rows_equal(job_dir, before)


@pytest.mark.process
def test_a_sigterm_to_the_job_and_wandb_after_the_record_ends_it_ok(tmp_path):
    """SLURM's ``scancel`` or preemption after the last step signals every process of the
    job, W&B's service too: the job ends as ``ok`` with its whole record and no traceback
    (the run cannot end: its service is gone), exit 0 (under SLURM: ``COMPLETED``, where 143
    left no result: a job lost, or requeued once more), and a re-run gives the run every
    row, once."""
    job_dir, args, stopped = end_after_record(tmp_path, "sigterm")
    assert stopped.returncode == 0, explain(stopped)
    assert "SIGTERM as the job ended: it ended ok" in stopped.stderr, explain(stopped)
    assert "Traceback" not in stopped.stdout + stopped.stderr, explain(stopped)
    before = summary(job_dir)
    assert (before["status"], before["global_step"]) == ("ok", 4), explain(stopped)
    assert len(before["history"]) == 4 and len(before["validation_history"]) == 1

    proc = run_train(args, tmp_path)
    assert proc.returncode == 0, explain(proc)
    assert "finished it now" in proc.stdout, explain(proc)
    assert read_run(job_dir)["exit_code"] == 0
    assert summary(job_dir) == before
    assert_rows_equal(job_dir, before)


@pytest.mark.process
def test_a_sigterm_as_a_sweeps_job_ends_ok_starts_no_further_job(tmp_path):
    """``kiln-train -m`` runs its jobs one after another in one process: a SIGTERM held while
    the first ends ok leaves that job ok, and the process stops (143) before the next one
    writes or trains anything."""
    job_dir, _, stopped = end_after_record(tmp_path, "sigterm", ["trainer.seed=0,1"])
    assert stopped.returncode == 128 + signal.SIGTERM, explain(stopped)
    assert summary(job_dir)["status"] == "ok", explain(stopped)
    assert not (job_dir.parent / "1" / "summary.json").exists(), explain(stopped)
    assert not (job_dir.parent / "1" / "attempts.json").exists(), explain(stopped)
