"""A small causal LM trained on the same real tokens by kiln (padded, packed, packed +
compile), HF ``transformers.Trainer`` and the Lightning ``Trainer``, side by side.

The corpus is ``scripts/make_corpus.py``'s (Python source files no one here wrote). The first
training documents, tokenized with the corpus's tokenizer and cut into pieces of at most
``--max-length`` tokens, are what every variant trains on, one epoch; the first validation
documents, cut the same way, are what each trained model is evaluated on (one piece a row,
unpadded: the loss per real token, the same code for every variant). Every variant starts
from the same weights (a Llama of ``--layers`` layers, the corpus's vocabulary) and trains
with AdamW (fused, no weight decay), a constant learning rate, fp32, no clipping, in a
process of its own (``scripts/peers/lm_kiln_job.py`` in kiln's environment,
``scripts/peers/lm_peer_job.py`` in the peers' environment that ``bench_peers.py`` builds):

- ``kiln-padded``: one piece a row, padded to ``--max-length``;
- ``kiln-packed``: pieces packed into full rows (``data.packing=true``'s packer and mask);
- ``kiln-packed-compile``: the same under ``torch.compile``;
- ``kiln-packed-graphs``: the same under ``torch.compile`` mode ``reduce-overhead`` (CUDA
  graphs over the fixed packed shapes; ``--accelerator cuda`` only);
- ``hf``: HF Trainer, dynamic padding (each batch to its longest piece) + ``group_by_length``;
- ``hf-flat``: HF Trainer with its padding-free ``DataCollatorWithFlattening`` (exact here:
  transformers builds the block-diagonal SDPA mask from the restarting positions);
- ``lightning``: the Lightning Trainer, dynamic padding, shuffled.

Real tokens are the labels the loss counts (never padding, never a piece's first token).
Each job records, after every step, the seconds since its first step began and the real
tokens so far; the figures are taken at the same real-token budget for all (the fewest any
variant trained): ``time_s`` to reach it (compilation included), ``tokens/s`` = budget /
``time_s``. Rounds interleave the variants (the next round starts one later); printed are the
medians over rounds, each kiln variant's tokens/s over each peer's with the paired bootstrap
95% interval (a round's runs drawn together), and the validation loss per real token.

    uv run --frozen --all-packages python scripts/bench_peers_lm.py --rounds 2
    uv run --frozen --all-packages python scripts/bench_peers_lm.py --smoke   # tiny, seconds
    # a GPU without network (scripts/gpu_check.sh lm): every job on CUDA in bf16 AMP, the
    # peers under the machine's own python3
    python3 scripts/bench_peers_lm.py --accelerator cuda --precision bf16-mixed \
        --peer-python python3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_peers import job_env, peer_env, versions

ROOT = Path(__file__).resolve().parent.parent
PEERS = ROOT / "scripts" / "peers"
KILN = ("kiln-padded", "kiln-packed", "kiln-packed-compile", "kiln-packed-graphs")
OTHERS = ("hf", "hf-flat", "lightning")
VARIANTS = KILN + OTHERS
CUDA_ONLY = ("kiln-packed-graphs",)  # compile mode reduce-overhead: CUDA graphs


def corpus_dir() -> Path:
    """Where ``make_corpus.py`` wrote the corpus (``$KILN_CORPUS``, else the cache)."""
    if os.environ.get("KILN_CORPUS"):
        return Path(os.environ["KILN_CORPUS"])
    cache = Path(os.environ.get("KILN_CACHE", Path.home() / ".cache" / "kiln"))
    return cache / "corpus"


def cut(documents: list[list[int]], length: int) -> list[list[int]]:
    """Each document in pieces of at most ``length`` tokens (pieces of one token dropped:
    they have nothing to predict)."""
    pieces = [d[i : i + length] for d in documents for i in range(0, len(d), length)]
    return [p for p in pieces if len(p) > 1]


def read_documents(corpus: Path, split: str, tokens: int, tokenizer: Any) -> list[list[int]]:
    """The split's first documents, in shard order, until they hold ``tokens`` tokens."""
    import pyarrow.parquet as pq

    shards = sorted(corpus.glob(f"{split}-*.parquet"))
    if not shards:
        raise SystemExit(f"no {split}-*.parquet in {corpus}: run scripts/make_corpus.py first")
    documents: list[list[int]] = []
    total = 0
    for shard in shards:
        for text in pq.read_table(shard, columns=["text"]).column("text").to_pylist():
            ids = tokenizer(text)["input_ids"]
            documents.append(ids)
            total += len(ids)
            if total >= tokens:
                return documents
    return documents


def prepare(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``job.json``, ``pieces.json`` and the starting weights (``model/``) under ``work``."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    corpus = corpus_dir()
    tokenizer = AutoTokenizer.from_pretrained(corpus / "tokenizer")
    train = cut(read_documents(corpus, "train", args.train_tokens, tokenizer), args.max_length)
    val = cut(read_documents(corpus, "validation", args.val_tokens, tokenizer), args.max_length)
    torch.manual_seed(args.seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=args.hidden, intermediate_size=args.hidden * 4,
        num_hidden_layers=args.layers, num_attention_heads=args.hidden // 32,
        num_key_value_heads=max(args.hidden // 64, 1), max_position_embeddings=args.max_length,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id, attention_dropout=0.0,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(work / "model")
    tokenizer.save_pretrained(work / "model")
    (work / "pieces.json").write_text(json.dumps({"train": train, "validation": val}))
    mean = statistics.mean(len(p) for p in train)
    job = {
        "max_length": args.max_length,
        "rows_per_batch": args.rows,
        # hf-flat's batches hold about as many tokens as a packed batch of --rows rows
        "pieces_per_batch": max(round(args.rows * args.max_length / mean), 1),
        "lr": args.lr,
        "seed": args.seed,
        "pad_id": tokenizer.pad_token_id,
        "accelerator": args.accelerator,
        "precision": args.precision,
    }
    (work / "job.json").write_text(json.dumps(job))
    counted = sum(len(p) - 1 for p in train)
    padded = len(train) * args.max_length
    return {
        **job,
        "train_pieces": len(train),
        "train_real_tokens": counted,
        "padding_if_padded_to_max_length": 1 - sum(len(p) for p in train) / padded,
        "val_pieces": len(val),
        "parameters": sum(p.numel() for p in LlamaForCausalLM(config).parameters()),
    }


def run_once(variant: str, work: Path, out: Path, peer_python: Path) -> dict[str, Any]:
    """One whole process of ``variant``; its trace and telemetry."""
    if variant in KILN:
        cmd = [sys.executable, str(PEERS / "lm_kiln_job.py"), str(work), str(out), variant]
    else:
        cmd = [str(peer_python), str(PEERS / "lm_peer_job.py"), str(work), str(out), variant]
    done = subprocess.run(cmd, capture_output=True, text=True, env=job_env(out / "events", out))
    if done.returncode != 0:
        raise SystemExit(f"{variant} failed:\n{done.stderr[-4000:]}")
    return json.loads((out / "result.json").read_text())


def time_to(trace: list[list[float]], tokens: float) -> float:
    """Seconds until ``tokens`` real tokens were trained (linear within the step that got
    there)."""
    before_t, before_n = 0.0, 0.0
    for t, n in trace:
        if n >= tokens:
            return before_t + (t - before_t) * (tokens - before_n) / (n - before_n)
        before_t, before_n = t, n
    raise ValueError(f"the trace never reaches {tokens} tokens")


def validation_loss(model_dir: Path, pieces: list[list[int]]) -> float:
    """Mean loss per real token over the held-out pieces, one piece a row, unpadded."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for piece in pieces:
            ids = torch.tensor([piece])
            logits = model(input_ids=ids).logits[0, :-1]
            total += float(torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum"))
            count += len(piece) - 1
    return total / count


def report(results: dict[str, list[dict[str, Any]]], budget: float, info: dict[str, Any]) -> str:
    from kiln.experiments.bench.stats import bootstrap_speedup_interval

    lines = [f"{k}: {v}" for k, v in info.items()]
    lines.append(f"real-token budget (the fewest any variant trained): {budget:.0f}")
    head = f"{'variant':<20}{'tokens/s':>20}{'time_s':>20}{'val loss/token':>16}{'padding':>9}"
    lines += [head, "-" * len(head)]
    for variant, runs in results.items():
        rates = [r["tokens_per_s"] for r in runs]
        times = [r["time_s"] for r in runs]
        padding = runs[0].get("padding_fraction")
        lines.append(
            f"{variant:<20}{statistics.median(rates):>9.0f} ({min(rates):.0f}-{max(rates):.0f})"
            f"{statistics.median(times):>9.2f} ({min(times):.1f}-{max(times):.1f})"
            f"{statistics.median(r['val_loss'] for r in runs):>16.4f}"
            f"{'' if padding is None else f'{padding:.1%}':>9}"
        )
    lines.append("")
    for mine in (v for v in KILN if v in results):
        for peer in (v for v in OTHERS if v in results):
            # tokens/s ratio = the peer's time over kiln's at the same tokens, paired by round
            kiln_t = [r["time_s"] for r in results[mine]]
            peer_t = [r["time_s"] for r in results[peer]]
            ratio = statistics.median(peer_t) / statistics.median(kiln_t)
            low, high = bootstrap_speedup_interval(peer_t, kiln_t)
            said = (
                "one round: no interval" if len(kiln_t) < 2
                else "kiln faster" if low > 1 else "kiln slower" if high < 1
                else "within the spread"
            )  # fmt: skip
            lines.append(
                f"{mine} / {peer}: real tokens/s {ratio:.2f}x, "
                f"95% interval {low:.2f}-{high:.2f}: {said}"
            )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """The options, and the variants to run (checked against the accelerator)."""
    parser = argparse.ArgumentParser(description="kiln against HF and Lightning on a causal LM")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved runs per variant")
    parser.add_argument("--train-tokens", type=int, default=60_000, help="training tokens")
    parser.add_argument("--val-tokens", type=int, default=8_000, help="held-out tokens")
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--rows", type=int, default=4, help="rows per batch (padded and packed)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default=None, help="comma-separated variants (default: all)")
    parser.add_argument("--accelerator", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--precision", choices=("32-true", "bf16-mixed"), default="32-true",
        help="every variant's (bf16-mixed: autocast, fp32 weights)",
    )  # fmt: skip
    parser.add_argument(
        "--peer-python", type=Path, default=None,
        help="run the peers under this interpreter (it has transformers, datasets, lightning "
        "and accelerate) instead of building their environment (which needs a package index)",
    )  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="a tiny setting: seconds, one round")
    parser.add_argument(
        "--env-dir", type=Path, default=Path.home() / ".cache" / "kiln-bench-peers",
        help="where the peers' environment is built (once; bench_peers.py's)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write the runs' figures here")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.train_tokens, args.val_tokens = 1, 3_000, 500
        args.max_length, args.layers, args.hidden = 64, 1, 64
    offered = [v for v in VARIANTS if args.accelerator == "cuda" or v not in CUDA_ONLY]
    chosen = [v.strip() for v in (args.only or ",".join(offered)).split(",") if v.strip()]
    if bad := [v for v in chosen if v not in offered]:
        parser.error(
            f"--only: {bad} not offered with --accelerator {args.accelerator}; choose from "
            f"{', '.join(offered)}" + (" (CUDA graphs need --accelerator cuda)"
                                      if set(bad) & set(CUDA_ONLY) else "")
        )  # fmt: skip
    if args.rounds < 1 or args.hidden % 64:
        parser.error("--rounds must be >= 1 and --hidden a multiple of 64")
    return args, chosen


def main() -> None:
    args, chosen = parse_args()
    peer_python = Path(sys.executable)
    if set(chosen) & set(OTHERS):
        peer_python = args.peer_python or peer_env(args.env_dir)
    load_start = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="kiln-peers-lm-"))
    try:
        info = prepare(work, args)
        val = json.loads((work / "pieces.json").read_text())["validation"]
        raw: dict[str, list[dict[str, Any]]] = {v: [] for v in chosen}
        for round_ in range(args.rounds):
            order = chosen[round_ % len(chosen) :] + chosen[: round_ % len(chosen)]
            for variant in order:
                out = work / f"{variant}-{round_}"
                result = run_once(variant, work, out, peer_python)
                result["val_loss"] = validation_loss(out / "model", val)
                raw[variant].append(result)
                seconds, trained = result["trace"][-1]
                said = f"{trained:.0f} real tokens in {seconds:.1f} s"
                print(f"round {round_ + 1} {variant}: {said}, val loss {result['val_loss']:.4f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    budget = min(r["trace"][-1][1] for runs in raw.values() for r in runs)
    results = {
        variant: [
            {
                "time_s": time_to(r["trace"], budget),
                "tokens_per_s": budget / time_to(r["trace"], budget),
                "val_loss": r["val_loss"],
                "padding_fraction": r.get("telemetry", {}).get("padding_fraction"),
                "kiln_steady_tokens_per_s": r.get("telemetry", {}).get("tokens_per_s"),
                "compile_time_s": r.get("telemetry", {}).get("compile_time_s"),
            }
            for r in runs
        ]
        for variant, runs in raw.items()
    }
    info["peers' versions"] = versions(peer_python) if peer_python != Path(sys.executable) else {}
    info["load average (1 min) start, end"] = (load_start, os.getloadavg()[0])
    info["cores"] = os.cpu_count()
    print(report(results, budget, info))
    if args.json:
        args.json.write_text(json.dumps({"info": info, "results": results}, indent=1))


if __name__ == "__main__":
    main()
