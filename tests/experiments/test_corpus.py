"""``scripts/make_corpus.py`` writes real source files as Parquet shards with a BPE tokenizer
of its own, and ``kiln-train experiment=corpus_llama_lm`` trains on them, packed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from train_helpers import explain, job_dirs, run_train, summary, write_tiny_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"))


def rows(corpus: Path, split: str) -> list[dict]:
    return [
        r for f in sorted(corpus.glob(f"{split}-*.parquet")) for r in pq.read_table(f).to_pylist()
    ]


def test_shards_hold_the_source_files_and_the_manifest_says_so(corpus: Path) -> None:
    from transformers import AutoTokenizer

    manifest = json.loads((corpus / "manifest.json").read_text())
    source = Path(manifest["source"])
    seen = set()
    for split in ("train", "validation"):
        got = rows(corpus, split)
        assert got and len(got) == manifest["splits"][split]["documents"]
        for row in got:
            assert row["text"] == (source / row["path"]).read_text(encoding="utf-8")
        seen |= {r["path"] for r in got}
        for name, digest in manifest["splits"][split]["shards"].items():
            assert hashlib.sha256((corpus / name).read_bytes()).hexdigest() == digest
    files = [p for p in source.rglob("*.py") if p.read_text(encoding="utf-8").strip()]
    assert seen == {p.relative_to(source).as_posix() for p in files}  # blank files skipped
    tokenizer = AutoTokenizer.from_pretrained(str(corpus / "tokenizer"))
    assert len(tokenizer) == manifest["tokenizer"]["vocab_size"] == 400
    ids = tokenizer("def f(x):\n    return x\n")["input_ids"]
    assert ids[-1] == tokenizer.eos_token_id  # documents end with <|endoftext|>
    assert tokenizer.decode(ids[:-1]) == "def f(x):\n    return x\n"


def test_a_files_split_is_its_path_hash(corpus: Path, tmp_path: Path) -> None:
    small = write_tiny_corpus(tmp_path)  # the same files; a second run writes the same shards
    first = json.loads((corpus / "manifest.json").read_text())["splits"]
    second = json.loads((small / "manifest.json").read_text())["splits"]
    assert first == second


def test_kiln_train_trains_on_the_corpus_packed(corpus: Path, tmp_path: Path) -> None:
    args = ["experiment=corpus_llama_lm", "trainer.max_steps=2", "trainer.val_every_n_steps=2",
            "logger=none", "data.max_length=64", "data.batch_size=2",
            "data.max_val_tokens=300"]  # fmt: skip
    proc = run_train(args, tmp_path, env={"KILN_CORPUS": str(corpus)})
    assert proc.returncode == 0, explain(proc)
    result = summary(job_dirs(tmp_path)[0])
    text = json.dumps(result)
    assert "val/loss" in text, text[:2000]
    assert "a uniform guess over the 400-token vocabulary" in proc.stdout, proc.stdout[-2000:]


def test_the_corpus_goes_where_kiln_corpus_says(monkeypatch, tmp_path: Path) -> None:
    # data=lm_corpus reads $KILN_CORPUS: the script writes there by default
    monkeypatch.setenv("KILN_CORPUS", str(tmp_path / "here"))
    scripts = str(Path(__file__).resolve().parents[2] / "scripts")
    monkeypatch.syspath_prepend(scripts)
    import make_corpus  # pyright: ignore[reportMissingImports]

    assert make_corpus.parse_args([]).out == tmp_path / "here"
    monkeypatch.delenv("KILN_CORPUS")
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "cache"))
    assert make_corpus.parse_args([]).out == tmp_path / "cache" / "corpus"
    assert make_corpus.parse_args([]).max_documents == 4000  # a default that writes in a minute
