"""Data identity on resume, through kiln-train: a job re-run into its directory on data that
is not what its checkpoint was trained on (a streamed corpus's shard changed, added or
removed; a local CSV with its labels flipped) is refused by name in the setup stage, before
any W&B run, its record and checkpoints untouched; ``data.allow_changed=true`` goes on and
the attempt records what changed, which kiln-report shows."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from train_helpers import FAST, explain, run_train, summary, write_tiny_corpus

STREAM = [
    *FAST,
    "model=llama-tiny-lm",
    "data=lm_corpus",
    "data.streaming=true",
    "data.max_length=64",
    "data.batch_size=2",
    "data.shuffle_buffer=4",
    "data.max_val_samples=2",
    "trainer.max_steps=2",
    "trainer.checkpoint_every_n_steps=2",
]
ROWS = [("a fine film", 1), ("awful", 0), ("great fun", 1), ("dull and slow", 0)] * 8


def _tree(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def streamed(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A streaming job of 2 steps on the corpus, checkpointed at step 2."""
    log_dir = tmp_path_factory.mktemp("streamed")
    job_dir = log_dir / "J"
    proc = run_train([*STREAM, f"paths.corpus_dir={corpus}", f"hydra.run.dir={job_dir}"], log_dir)
    assert proc.returncode == 0, explain(proc)
    return job_dir


@pytest.fixture
def edited(corpus: Path) -> Iterator[Path]:
    """The corpus, for a test to change; every file is put back as it was afterwards."""
    before = {p: p.read_bytes() for p in corpus.glob("*.parquet")}
    yield corpus
    for path in corpus.glob("*.parquet"):
        if path not in before:
            path.unlink()
    for path, data in before.items():
        path.write_bytes(data)


def _resume(job: Path, corpus: Path, tmp_path: Path, *extra: str):
    """The streaming job copied to ``tmp_path`` and re-run there for 4 steps."""
    copy = tmp_path / "job"
    shutil.copytree(job, copy, symlinks=True)
    args = [*STREAM, "trainer.max_steps=4", f"paths.corpus_dir={corpus}", f"hydra.run.dir={copy}"]
    return copy, run_train([*args, *extra], tmp_path)


def _upper(path: Path) -> None:
    table = pq.read_table(path)
    texts = [text.upper() for text in table.column("text").to_pylist()]
    pq.write_table(table.set_column(0, "text", pa.array(texts)), path)


def _refused(job: Path, proc, wandb_before: dict[str, bytes]) -> str:
    """The refusal's message, once it is known to be a setup-stage refusal that opened no W&B
    run and wrote no checkpoint."""
    assert proc.returncode == 1, explain(proc)
    record = summary(job)
    assert [a["ended"] for a in record["attempts"]] == ["ok"]  # the refused run wrote nothing
    assert _tree(job / "wandb") == wandb_before  # no W&B run opened
    assert sorted(p.name for p in (job / "checkpoints").glob("step-*")) == ["step-00000002.ckpt"]
    assert record["status"] == "ok" and record["global_step"] == 2  # the record stands
    said = f"{job}: refused, its record stays as it was: "
    line = next(line for line in proc.stderr.splitlines() if line.startswith(said))
    assert "DataChangedError" in line, line  # the setup stage's refusal
    return line.removeprefix(said)


@pytest.mark.parametrize("change", ["changed", "added", "removed"])
def test_a_changed_added_or_removed_shard_is_refused_by_name_before_wandb(
    streamed: Path, edited: Path, tmp_path: Path, change: str
) -> None:
    shards = sorted(edited.glob("train-*.parquet"))
    assert len(shards) >= 2, shards
    named = shards[1]
    if change == "changed":
        _upper(named)  # every document uppercased: as in the report
    elif change == "added":
        named = edited / "train-99999.parquet"
        shutil.copy(shards[0], named)
    else:
        named.unlink()
    wandb_before = _tree(streamed / "wandb")
    job, proc = _resume(streamed, edited, tmp_path)
    error = _refused(job, proc, wandb_before)
    assert f"training file {named} {change}" in error, error
    assert "data.allow_changed=true" in error
    assert "the data changed since" in proc.stdout + proc.stderr


def test_allow_changed_goes_on_and_the_attempt_and_kiln_report_say_what_changed(
    streamed: Path, edited: Path, tmp_path: Path
) -> None:
    from in_process import kiln_command

    shard = sorted(edited.glob("train-*.parquet"))[1]
    _upper(shard)
    job, proc = _resume(streamed, edited, tmp_path, "data.allow_changed=true")
    assert proc.returncode == 0, explain(proc)
    record = summary(job)
    assert record["status"] == "ok" and record["global_step"] == 4
    attempt = record["attempts"][-1]
    assert attempt["from_step"] == 2 and attempt["ended"] == "ok"
    assert attempt["data_changed"][0].startswith(f"training file {shard} changed ("), attempt
    assert json.loads((job / "attempts.json").read_text())[-1] == attempt
    report = kiln_command("report", [str(job), "--quiet"], {}, str(tmp_path), False, 300)
    assert report.returncode == 0, explain(report)
    text = (job / "report.md").read_text()
    assert f"resumed from step 2 on changed data: training file {shard} changed" in text, text


def test_a_local_csv_changed_in_place_is_refused_by_name_before_wandb(tmp_path: Path) -> None:
    csv = tmp_path / "reviews.csv"
    csv.write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in ROWS))
    job = tmp_path / "J"
    args = [
        *FAST, "data.dataset=csv", f"data.data_files={csv}", "data.val_split=null",
        "data.val_fraction=0.25", "data.batch_size=4", "trainer.checkpoint_every_n_steps=2",
        f"hydra.run.dir={job}",
    ]  # fmt: skip
    first = run_train([*args, "trainer.max_steps=2"], tmp_path)
    assert first.returncode == 0, explain(first)
    csv.write_text("text,label\n" + "".join(f"{t},{1 - y}\n" for t, y in ROWS))  # labels flipped
    wandb_before = _tree(job / "wandb")
    again = run_train([*args, "trainer.max_steps=4"], tmp_path)
    error = _refused(job, again, wandb_before)
    assert f"training file {csv} changed (same size" in error, error
    assert "training rows" not in error  # the same 24 rows, other labels
