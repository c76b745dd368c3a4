"""``kiln-train ... data.packing=true data.streaming=true``: a job SIGKILLed mid-stream and
re-run into its directory continues bit for bit where an uninterrupted job goes (every
step's loss, lr and grad norm, then the validation metrics), on 1 rank, 1 rank with
DataLoader workers, and 2 ranks; bad shards fail before any W&B run or checkpoint."""

from __future__ import annotations

import signal
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
    wait_until,
    write_tiny_corpus,
)

STEPS = 40
# the command docs/language-model-data.md gives, shrunk to seconds
STREAM = ["model=llama-tiny-lm", "data=lm_corpus", "data.packing=true", "data.streaming=true"]
ARGS = [
    *FAST,
    *STREAM,
    f"trainer.max_steps={STEPS}",
    "trainer.checkpoint_every_n_steps=5",
    "trainer.log_every_n_steps=1",
    "trainer.accumulate_grad_batches=2",
    "data.max_length=64",
    "data.batch_size=2",
    "data.shuffle_buffer=8",
    "data.max_val_samples=2",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"))


def killed_and_resumed(corpus: Path, log_dir: Path, extra: tuple[str, ...]) -> tuple[dict, dict]:
    """A job SIGKILLed after its first checkpoint, then re-run to the end; and the same job
    uninterrupted. Returns both records."""
    env = {"KILN_CORPUS": str(corpus)}
    job_dir = log_dir / "job"
    args = [*ARGS, *extra, f"paths.corpus_dir={corpus}"]
    proc, out = start_train(args, job_dir, log_dir, "SIGKILL")
    wait_until(proc, out, lambda _: bool(checkpointed_steps(job_dir)))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=300)
    assert max(checkpointed_steps(job_dir)) < STEPS, "the run finished before the signal"
    resumed = run_train([*args, f"hydra.run.dir={job_dir}"], log_dir, env=env, process=True)
    assert resumed.returncode == 0, explain(resumed)
    two = "trainer.devices=2" in extra  # workers launched as a user's job launches them
    plain = run_train([*args, f"hydra.run.dir={log_dir / 'plain'}"], log_dir, env=env, process=two)
    assert plain.returncode == 0, explain(plain)
    return summary(job_dir), summary(log_dir / "plain")


@pytest.mark.process
@pytest.mark.parametrize(
    "extra",
    [(), ("data.num_workers=2",), ("trainer.devices=2", "data.num_workers=1")],
    ids=["1-rank", "1-rank-2-workers", "2-ranks"],
)
def test_a_stream_killed_mid_pass_resumes_bit_for_bit(
    corpus: Path, tmp_path: Path, extra: tuple[str, ...]
) -> None:
    record, plain = killed_and_resumed(corpus, tmp_path, extra)
    resumed = record["attempts"][-1]
    assert 0 < resumed["from_step"] < STEPS  # it did resume, mid-stream, from a checkpoint
    assert [row["step"] for row in record["history"]] == list(range(1, STEPS + 1))
    assert record["history"] == plain["history"]  # every loss, lr and grad norm, bit for bit
    assert record["metrics"] == plain["metrics"]


@pytest.mark.process
def test_a_resume_with_other_workers_is_refused_naming_both(corpus: Path, tmp_path: Path) -> None:
    """Each worker reads its own documents: the stream continues only as it was read."""
    job_dir = tmp_path / "job"
    args = [*ARGS, "trainer.max_steps=5", f"paths.corpus_dir={corpus}", f"hydra.run.dir={job_dir}"]
    assert run_train(args, tmp_path).returncode == 0
    again = run_train([*args, "trainer.max_steps=8", "data.num_workers=1"], tmp_path)
    assert again.returncode == 1, explain(again)
    assert "data.num_workers: 0 -> 1" in again.stdout + again.stderr, explain(again)


def test_a_missing_shard_fails_before_wandb_and_checkpoints(tmp_path: Path) -> None:
    proc = run_train([*ARGS, f"paths.corpus_dir={tmp_path / 'nowhere'}"], tmp_path)
    assert proc.returncode == 1, explain(proc)
    (job_dir,) = job_dirs(tmp_path)
    record = summary(job_dir)
    assert record["error_stage"] == "setup", record["error"]
    assert "train-*.parquet' does not exist" in record["error"]
    assert "\n" not in record["error"]
    assert not (job_dir / "wandb").exists()
    assert not list(job_dir.glob("checkpoints/step-*")), "no checkpoint before the data works"


def test_a_null_text_inside_a_shard_fails_before_wandb(corpus: Path, tmp_path: Path) -> None:
    """A null document in the middle of a training shard is named (shard and row) in the
    setup stage, not when the stream reaches it mid-run."""
    import shutil

    import pyarrow.parquet as pq

    broken = shutil.copytree(corpus, tmp_path / "corpus")
    shard = sorted(broken.glob("train-*.parquet"))[0]
    table = pq.read_table(shard)
    texts = table.column("text").to_pylist()
    texts[len(texts) // 2] = None
    column = table.schema.get_field_index("text")
    pq.write_table(table.set_column(column, "text", [texts]), shard)
    proc = run_train([*ARGS, f"paths.corpus_dir={broken}"], tmp_path)
    assert proc.returncode == 1, explain(proc)
    (job_dir,) = job_dirs(tmp_path)
    record = summary(job_dir)
    assert record["error_stage"] == "setup", record["error"]
    assert f"shard {shard}, row {len(texts) // 2}: column 'text' is empty (null)" in record["error"]
    assert not (job_dir / "wandb").exists()
