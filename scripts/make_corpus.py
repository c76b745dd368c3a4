"""Write a real text corpus to Parquet shards, offline: the Python source files of the
packages installed in this environment (code no one in kiln wrote; documents from a few
tokens to tens of thousands), with a byte-level BPE tokenizer trained on its training split.

    uv run --frozen --all-packages python scripts/make_corpus.py            # ~/.cache/kiln/corpus
    uv run --frozen --all-packages python scripts/make_corpus.py --out DIR --max-documents 0

By default it keeps the first 4,000 files (about 17M tokens; under a minute on 2 idle
cores); ``--max-documents 0`` keeps every one. The BPE is trained on the first
``--tokenizer-documents`` training files and every file is tokenized (for the manifest's
counts) on every core: a fast tokenizer's batch runs in parallel.

Writes ``DIR/train-NNNNN.parquet`` and ``DIR/validation-NNNNN.parquet`` (columns ``text``,
``path``, ``package``), ``DIR/tokenizer/`` (a transformers tokenizer: ``AutoTokenizer``
loads it; every document ends with ``<|endoftext|>``) and ``DIR/manifest.json`` (the source,
counts, token lengths, each shard's sha256). ``data=lm_corpus`` trains on it
(``docs/language-model-data.md``).

A file's split and its place in the shards are a hash of its path, so it stays put whatever
else is installed, and the same environment writes the same shards.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sysconfig
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

EOS = "<|endoftext|>"


def default_out() -> Path:
    """``$KILN_CORPUS``, else ``$KILN_CACHE/corpus``, else ``~/.cache/kiln/corpus``: where
    ``data=lm_corpus`` reads (``paths.corpus_dir``)."""
    if os.environ.get("KILN_CORPUS"):
        return Path(os.environ["KILN_CORPUS"])
    cache = os.environ.get("KILN_CACHE", str(Path.home() / ".cache" / "kiln"))
    return Path(cache) / "corpus"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--source",
        type=Path,
        default=Path(sysconfig.get_paths()["purelib"]),
        help="directory whose source files are the documents (site-packages)",
    )
    parser.add_argument("--out", type=Path, default=default_out(), help="output directory")
    parser.add_argument("--pattern", default="*.py", help="file name glob of the documents")
    parser.add_argument(
        "--max-documents",
        type=int,
        default=4000,
        help="keep only the first N documents (in path-hash order); 0: every one",
    )
    parser.add_argument(
        "--max-bytes",
        type=int,
        default=200_000,
        help="skip files larger than this (generated tables, vendored blobs)",
    )
    parser.add_argument(
        "--val-percent",
        type=int,
        default=5,
        help="percent of documents (by path hash) in the validation split",
    )
    parser.add_argument("--docs-per-shard", type=int, default=2000)
    parser.add_argument("--vocab-size", type=int, default=8192, help="BPE vocabulary size")
    parser.add_argument(
        "--tokenizer-documents",
        type=int,
        default=4000,
        help="train the tokenizer on the first N training documents",
    )
    args = parser.parse_args(argv)  # fmt: skip
    if not args.source.is_dir():
        parser.error(f"--source {str(args.source)!r} is not a directory")
    if not 0 < args.val_percent < 100:
        parser.error(f"--val-percent={args.val_percent} must be in 1..99")
    if args.max_documents < 0:
        parser.error(f"--max-documents={args.max_documents} must be >= 0 (0: every file)")
    if args.vocab_size < 300:
        parser.error(f"--vocab-size={args.vocab_size} must be >= 300 (256 bytes + merges)")
    return args


def path_hash(path: str) -> int:
    return int.from_bytes(hashlib.sha256(path.encode()).digest()[:8], "big")


def documents(args: argparse.Namespace) -> list[dict[str, str]]:
    """The source files as documents (UTF-8 text, not empty, at most ``max_bytes``), in the
    order of their path's hash: any prefix (``--max-documents``, ``max_train_samples``) is a
    sample spread over the packages, the same in every environment that has those files."""
    paths = [p for p in args.source.rglob(args.pattern) if p.is_file()]
    named = sorted((path_hash(p.relative_to(args.source).as_posix()), p) for p in paths)
    docs = []
    for _, path in named:
        if path.stat().st_size > args.max_bytes:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if not text.strip():
            continue
        relative = path.relative_to(args.source).as_posix()
        docs.append({"text": text, "path": relative, "package": relative.split("/")[0]})
        if args.max_documents and len(docs) >= args.max_documents:
            break
    if not docs:
        raise SystemExit(f"no {args.pattern} documents under {args.source}")
    return docs


def split_of(path: str, val_percent: int) -> str:
    # a different slice of the hash than the order, so validation is spread over it too
    return "validation" if (path_hash(path) >> 7) % 100 < val_percent else "train"


def train_tokenizer(texts: list[str], vocab_size: int, out: Path) -> Any:
    """A byte-level BPE (GPT-2 style) trained on ``texts``, saved for ``AutoTokenizer``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    eos_id = tokenizer.token_to_id(EOS)
    # each document ends with EOS, so a model learns where documents stop
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", special_tokens=[(EOS, eos_id)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=EOS, eos_token=EOS, pad_token=EOS,
        unk_token=EOS, model_max_length=1_000_000,
    )  # fmt: skip
    fast.save_pretrained(str(out))
    return fast


def token_lengths(tokenizer: Any, texts: list[str], batch: int = 256) -> list[int]:
    """Tokens per document, a batch at a time (all ids at once would hold gigabytes), each
    batch on every core (the Rust tokenizer's thread pool; no offsets computed)."""
    backend = tokenizer.backend_tokenizer
    lengths = []
    for start in range(0, len(texts), batch):
        lengths += [len(e.ids) for e in backend.encode_batch_fast(texts[start : start + batch])]
    return lengths


def write_shards(rows: list[dict[str, str]], split: str, out: Path, per_shard: int) -> list[Path]:
    files = []
    for index, start in enumerate(range(0, len(rows), per_shard)):
        file = out / f"{split}-{index:05d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows[start : start + per_shard]), file)
        files.append(file)
    return files


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # tokenize on every core even where TOKENIZERS_PARALLELISM=false is exported (make does,
    # for forked DataLoader workers); restored after, for a caller that forks later
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    try:
        write_corpus(args)
    finally:
        if before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


def write_corpus(args: argparse.Namespace) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.parquet"):  # a smaller rerun leaves no stale shard behind
        old.unlink()
    docs = documents(args)
    splits: dict[str, list[dict[str, str]]] = {"train": [], "validation": []}
    for doc in docs:
        splits[split_of(doc["path"], args.val_percent)].append(doc)
    tokenizer = train_tokenizer(
        [d["text"] for d in splits["train"][: args.tokenizer_documents]],
        args.vocab_size,
        args.out / "tokenizer",
    )
    manifest: dict[str, Any] = {
        "source": str(args.source),
        "pattern": args.pattern,
        "max_bytes": args.max_bytes,
        "val_percent": args.val_percent,
        "tokenizer_documents": min(args.tokenizer_documents, len(splits["train"])),
        "tokenizer": {"path": "tokenizer", "vocab_size": len(tokenizer), "eos": EOS},
        "splits": {},
    }
    for split, rows in splits.items():
        files = write_shards(rows, split, args.out, args.docs_per_shard)
        lengths = sorted(token_lengths(tokenizer, [r["text"] for r in rows]))
        manifest["splits"][split] = {
            "documents": len(rows),
            "packages": len({r["package"] for r in rows}),
            "tokens": sum(lengths),
            "tokens_per_document": {
                "min": lengths[0] if lengths else 0,
                "median": statistics.median(lengths) if lengths else 0,
                "p90": lengths[int(0.9 * (len(lengths) - 1))] if lengths else 0,
                "max": lengths[-1] if lengths else 0,
            },
            "shards": {f.name: sha256(f) for f in files},
        }
        print(f"{split}: {len(rows)} documents, {sum(lengths)} tokens, {len(files)} shards")
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
