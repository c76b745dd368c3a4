"""Every command of docs/language-model-data.md runs as written, with small sizes appended:
``scripts/make_corpus.py`` on the standard library's ``email`` sources into ``$KILN_CORPUS``,
each ``kiln-train`` a few steps on such a corpus (the page's ``/data/my-corpus`` and
``/data/my-tokenizer`` are a copy of it with the text in a ``content`` column, and its
tokenizer)."""

from __future__ import annotations

import email
import runpy
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from readme_blocks import ROOT, commands, program, read_blocks
from train_helpers import explain, run_train, write_tiny_corpus

PAGE = ROOT / "docs" / "language-model-data.md"
COMMANDS = [
    (block, argv)
    for block in read_blocks(PAGE)
    if block.lang in ("bash", "sh") and not block.illustrative
    for argv in commands(block.text)
]
SMALL_CORPUS = ["--source", str(Path(email.__file__).parent), "--vocab-size", "400",
                "--docs-per-shard", "10", "--val-percent", "20"]  # fmt: skip
SMALL_TRAIN = {
    "trainer.max_steps": "2",
    "trainer.val_every_n_steps": "2",
    "logger": "none",
    "data.batch_size": "2",
    "data.max_length": "64",
    "data.max_train_samples": "8",
    "data.max_val_tokens": "256",
    "data.shuffle_buffer": "4",
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def placeholders(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The page's example paths, as files: the corpus with its text in ``content``."""
    mine = tmp_path_factory.mktemp("my-corpus")
    (mine / "train").mkdir()
    for shard in sorted(corpus.glob("*.parquet")):
        table = pq.read_table(shard).rename_columns(["content", "path", "package"])
        name = shard.name.replace("validation-", "val-")
        pq.write_table(table, mine / name)
        if name.startswith("train-"):
            pq.write_table(table, mine / "train" / name)
    return {"/data/my-corpus": str(mine), "/data/my-tokenizer": str(corpus / "tokenizer")}


def small(args: list[str], placeholders: dict[str, str]) -> list[str]:
    """``args`` with the example paths made real and the sizes made small."""
    out = []
    for arg in args:
        for example, real in placeholders.items():
            arg = arg.replace(example, real)
        if arg.split("=", 1)[0] not in SMALL_TRAIN:
            out.append(arg)
    return [*out, *(f"{key}={value}" for key, value in SMALL_TRAIN.items())]


def test_the_page_has_the_commands_a_newcomer_runs():
    names = [program(argv)[0] for _, argv in COMMANDS]
    assert names[0] == "scripts/make_corpus.py" and "kiln-train" in names
    assert all(argv[:4] == ["uv", "run", "--frozen", "--all-packages"] for _, argv in COMMANDS)


@pytest.mark.parametrize(
    ("block", "argv"), COMMANDS, ids=[f"{b.where}:{' '.join(a[4:6])}" for b, a in COMMANDS]
)
def test_a_command_of_the_page_runs(
    block, argv, corpus: Path, placeholders: dict[str, str], tmp_path: Path, monkeypatch
) -> None:
    name, args = program(argv)
    if name == "scripts/make_corpus.py":  # writes where $KILN_CORPUS says
        monkeypatch.setenv("KILN_CORPUS", str(tmp_path / "corpus"))
        monkeypatch.setattr(sys, "argv", [str(ROOT / name), *args, *SMALL_CORPUS])
        runpy.run_path(str(ROOT / name), run_name="__main__")
        assert (tmp_path / "corpus" / "manifest.json").is_file()
        assert (tmp_path / "corpus" / "tokenizer" / "tokenizer.json").is_file()
        return
    assert name == "kiln-train", f"{block.where}: no test runs `{' '.join(argv)}`"
    proc = run_train(small(args, placeholders), tmp_path, env={"KILN_CORPUS": str(corpus)})
    assert proc.returncode == 0, explain(proc)
    if "experiment=corpus_llama_lm" in args:  # the job ends with its loss beside ln(V)
        assert "a uniform guess over the 400-token vocabulary" in proc.stdout, proc.stdout[-3000:]
