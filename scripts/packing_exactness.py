"""How exact packing is, and what it saves: packed rows against the same document pieces run
one per row (unpadded), for the tiny Llama (rotary) and GPT-2 (absolute positions), in
float64 and float32; and the padding share of the corpus one document per row vs packed.

    uv run --frozen --all-packages python scripts/packing_exactness.py [--corpus DIR]

Reads the corpus of scripts/make_corpus.py (its validation documents and tokenizer) when it
exists, else random token ids. Prints one line per model and dtype: the largest difference
of a piece's summed loss and of a gradient entry, and the largest gradient entry for scale.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

import torch

from kiln.models import create_model
from kiln.models.data.packing import pack_documents, pieces_of
from kiln.models.tokens import token_nll

sys.path.insert(0, str(Path(__file__).parent))
from make_corpus import default_out

MODELS = ("llama-tiny-lm", "gpt2-tiny-lm")


def corpus_documents(corpus: Path, n: int, limit: int) -> tuple[list[list[int]], str | None]:
    if not (corpus / "manifest.json").exists():
        generator = torch.Generator().manual_seed(0)
        lengths = torch.randint(1, limit, (n,), generator=generator).tolist()
        ids = [torch.randint(5, 1000, (k,), generator=generator).tolist() for k in lengths]
        return ids, None
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(corpus / "tokenizer"))
    texts = pq.read_table(sorted(corpus.glob("validation-*.parquet"))[0]).column("text")
    ids = tokenizer(texts.to_pylist()[:n], verbose=False)["input_ids"]
    return [doc[:limit] for doc in ids], str(corpus / "tokenizer")


def differences(name: str, dtype: torch.dtype, batch: dict, tokenizer: str | None) -> str:
    torch.manual_seed(0)
    kwargs = {"tokenizer": tokenizer} if tokenizer else {}
    model = create_model(name, tiny=True, **kwargs).to(dtype)
    model.model.apply(lambda m: setattr(m, "p", 0.0) if isinstance(m, torch.nn.Dropout) else None)
    nll, _ = token_nll(
        model.model(**model.model_inputs(batch)).logits[:, :-1], batch["labels"][:, 1:]
    )
    nll.sum().backward()
    packed = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    loss_diff, total = 0.0, torch.zeros((), dtype=dtype)
    for row, start, end in pieces_of(batch["document_ids"]):
        ids = batch["input_ids"][row : row + 1, start:end]
        piece = model.token_nll({"input_ids": ids, "labels": ids})[0]
        gap = (nll[row, start : end - 1].sum() - piece.sum()).abs().item()
        loss_diff, total = max(loss_diff, gap), total + piece.sum()
    total.backward()
    grad_diff = max((packed[n] - p.grad).abs().max().item() for n, p in model.named_parameters())
    scale = max(p.grad.abs().max().item() for p in model.parameters())
    return (
        f"{name:14s} {str(dtype).removeprefix('torch.'):8s} max|d piece loss| {loss_diff:.2e}  "
        f"max|d grad| {grad_diff:.2e}  (max|grad| {scale:.2e})"
    )


def padding_shares(corpus: Path, max_length: int, n: int) -> str | None:
    if not (corpus / "manifest.json").exists():
        return None
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(corpus / "tokenizer"))
    texts = pq.read_table(sorted(corpus.glob("train-*.parquet"))[0]).column("text").to_pylist()
    lengths = [len(doc) for doc in tokenizer(texts[:n], verbose=False)["input_ids"]]
    kept = sum(min(k, max_length) for k in lengths)
    padded = 1 - kept / (len(lengths) * max_length)
    _, stats = pack_documents([[0] * k for k in lengths], max_length, pad_token_id=0)
    return (
        f"{len(lengths)} train documents, max_length {max_length}: one per row (truncated) "
        f"pads {padded:.1%} of positions and keeps {kept / sum(lengths):.1%} of the tokens; "
        f"packed ({stats.rows} rows) pads {stats.padding_fraction:.2%} and keeps 100%"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--corpus", type=Path, default=Path(os.environ.get("KILN_CORPUS", default_out()))
    )
    parser.add_argument("--documents", type=int, default=12)
    parser.add_argument("--max-length", type=int, default=128)
    args = parser.parse_args()
    docs, tokenizer = corpus_documents(args.corpus, args.documents, 3 * args.max_length)
    arrays, stats = pack_documents(docs, args.max_length, pad_token_id=0, seed=0)
    batch = {k: torch.from_numpy(v) for k, v in arrays.items()}
    source = f"corpus {args.corpus}" if tokenizer else "random token ids (no corpus)"
    print(f"{platform.machine()} CPU, torch {torch.__version__}; {source}")
    print(
        f"{stats.documents} documents -> {stats.pieces} pieces in {stats.rows} rows "
        f"of {args.max_length}"
    )
    for name in MODELS:
        for dtype in (torch.float64, torch.float32):
            print(differences(name, dtype, batch, tokenizer))
    shares = padding_shares(args.corpus, 512, 2000)
    if shares:
        print(shares)


if __name__ == "__main__":
    main()
