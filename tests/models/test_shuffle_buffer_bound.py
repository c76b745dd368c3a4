"""A shuffle buffer that cannot fit in memory is refused at setup, in one line, before any
W&B run: ``data.shuffle_buffer=100000000`` on a streamed corpus filled forever, ~10 MB/s."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kiln.models.data import stream_setup
from kiln.models.data.stream_setup import check_shuffle_buffer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
from train_helpers import FAST, explain, run_train, summary, write_tiny_corpus

GiB = 2**30


def test_the_estimate_counts_rows_tokens_and_readers(monkeypatch) -> None:
    monkeypatch.setattr(stream_setup, "available_memory", lambda: 2 * GiB)
    row = 4 * 128 * 8 + stream_setup.ROW_OVERHEAD  # four int64 arrays of 128 tokens
    fits = GiB // row
    check_shuffle_buffer(fits, 128, 0)  # half the memory available: accepted
    with pytest.raises(ValueError) as refused:
        check_shuffle_buffer(fits, 128, 2)  # two workers: two buffers
    assert str(refused.value) == (
        f"data.shuffle_buffer={fits} would hold {fits} rows of 128 tokens in each of 2 reader(s) "
        "(max(1, num_workers)): about 2.0 GiB, more than half the 2.0 GiB of memory available; "
        f"use at most {fits // 2} (a few hundred to a few thousand rows shuffle a stream well)"
    )
    monkeypatch.setattr(stream_setup, "available_memory", lambda: None)
    check_shuffle_buffer(10**12, 128, 0)  # no figure to compare with: not refused


def test_kiln_train_refuses_it_at_setup_before_any_wandb_run(tmp_path) -> None:
    corpus = write_tiny_corpus(tmp_path / "corpus")
    job_dir = tmp_path / "job"
    args = [*FAST, "model=llama-tiny-lm", "data=lm_corpus", "data.streaming=true",
            "data.shuffle_buffer=100000000", f"paths.corpus_dir={corpus}",
            f"hydra.run.dir={job_dir}"]  # fmt: skip
    proc = run_train(args, tmp_path)
    assert proc.returncode == 1, explain(proc)
    record = summary(job_dir)
    assert record["error_stage"] == "setup"
    assert record["error"].startswith("ValueError: data.shuffle_buffer=100000000 would hold"), (
        record
    )
    assert record["wandb"] is None and not (job_dir / "wandb").exists()
