"""A job SIGKILLed right after its final ``summary.json`` write leaves its W&B run without
an exit record; a re-run of the finished job finishes that run (and only that once)."""

from __future__ import annotations

import struct
from pathlib import Path

from train_helpers import FAST, explain, run_train, summary

from kiln.experiments.tracking.tracker import FINISHED_FILE
from kiln.experiments.tracking.wandb_files import read_run, read_summary

BLOCK = 32768  # a .wandb file is a leveldb-style log: 32 KiB blocks of chunked records
HEADER = 7  # ":W&B" and the format version


def cut_at_exit(run_file: Path) -> None:
    """Truncate ``run_file`` where its exit record starts: what a kill between the job's
    record and its run's end leaves."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = run_file.read_bytes()
    pos, start, record = HEADER, HEADER, b""
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a chunk header
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind in (1, 2):  # a full record, or a record's first chunk
            start, record = pos, b""
        record += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a record ends
            parsed = pb.Record()
            parsed.ParseFromString(record)
            if parsed.WhichOneof("record_type") == "exit":
                run_file.write_bytes(data[:start])
                return
    raise AssertionError(f"{run_file} holds no exit record")


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

    again = run_train(args, tmp_path)  # finished: nothing more to do
    assert "finished it now" not in again.stdout, explain(again)
    assert len(list(job_dir.glob("wandb/offline-run-*/run-*.wandb"))) == 2
