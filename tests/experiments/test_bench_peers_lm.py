"""``scripts/bench_peers_lm.py``: kiln padded / packed / packed + compile against HF Trainer
and the Lightning Trainer on the same real tokens. Figures are printed, never asserted; what
is asserted is that every variant trains the same tokens and that the figures are read at
the same token budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from train_helpers import write_tiny_corpus

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import bench_peers_lm  # noqa: E402  # pyright: ignore[reportMissingImports]


def test_documents_are_cut_into_pieces_that_each_predict_something():
    pieces = bench_peers_lm.cut([[1, 2, 3, 4, 5], [6], [7, 8, 9, 10, 11]], 2)
    assert pieces == [[1, 2], [3, 4], [7, 8], [9, 10]]  # [5], [6], [11]: nothing to predict


def test_time_to_a_budget_interpolates_within_the_step_that_reaches_it():
    trace = [[1.0, 100], [3.0, 300], [4.0, 350]]
    assert bench_peers_lm.time_to(trace, 100) == 1.0
    assert bench_peers_lm.time_to(trace, 200) == 2.0
    assert bench_peers_lm.time_to(trace, 50) == 0.5
    with pytest.raises(ValueError, match="never reaches"):
        bench_peers_lm.time_to(trace, 351)


def test_hf_flattening_collator_is_exact_with_sdpa_on_this_device():
    """What lets ``hf-flat`` take part: transformers turns the restarting positions of a
    flattened batch into a block-diagonal SDPA mask, so each piece's logits are its own; only
    without a KV cache (``use_cache=False``, which ``Trainer`` sets: its ``args.use_cache``
    defaults to False). With the model's default cache the pieces attend to each other."""
    from transformers import DataCollatorWithFlattening, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
    )  # fmt: skip
    model = LlamaForCausalLM(config).double().eval()
    pieces = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18, 19]]
    batch = DataCollatorWithFlattening()([{"input_ids": p, "labels": list(p)} for p in pieces])
    assert "attention_mask" not in batch  # the mask comes from the positions alone
    inputs = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"]}
    logits = model(**inputs, use_cache=False).logits
    start = 0
    for piece in pieces:
        alone = model(input_ids=torch.tensor([piece])).logits
        got = logits[:, start : start + len(piece)]
        torch.testing.assert_close(got, alone, rtol=0.0, atol=1e-12)
        start += len(piece)
    crossed = model(**inputs).logits  # config.use_cache=True: no packed-sequence mask
    assert not torch.allclose(crossed[:, 5:8], logits[:, 5:8], rtol=0.0, atol=1e-6)


@pytest.mark.slow  # compiles a model and trains it (the peers need their environment too)
def test_the_kiln_variants_train_the_same_tokens_and_print_the_table(tmp_path):
    corpus = write_tiny_corpus(tmp_path / "corpus")
    out = tmp_path / "lm.json"
    env = {**os.environ, "KILN_CORPUS": str(corpus)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_peers_lm.py"), "--smoke",
         "--only", "kiln-padded,kiln-packed,kiln-packed-compile", "--json", str(out)],
        capture_output=True, text=True, timeout=1500, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "kiln-packed" in proc.stdout and "val loss/token" in proc.stdout, proc.stdout
    results = json.loads(out.read_text())["results"]
    for variant in ("kiln-padded", "kiln-packed", "kiln-packed-compile"):
        (run,) = results[variant]
        assert run["time_s"] > 0 and run["tokens_per_s"] > 0, (variant, run)
        assert 0 < run["val_loss"] < 10, (variant, run)
    # compiling changes nothing but speed: the same packed rows, the same trained weights
    packed, compiled = results["kiln-packed"][0], results["kiln-packed-compile"][0]
    assert packed["val_loss"] == pytest.approx(compiled["val_loss"], rel=1e-4)
    assert all(results[v][0]["padding_fraction"] is not None for v in results)


def test_cuda_graphs_are_offered_on_cuda_only(capsys):
    _, chosen = bench_peers_lm.parse_args([])
    assert "kiln-packed-graphs" not in chosen and "kiln-packed-compile" in chosen
    _, chosen = bench_peers_lm.parse_args(["--accelerator", "cuda"])
    assert "kiln-packed-graphs" in chosen
    with pytest.raises(SystemExit):
        bench_peers_lm.parse_args(["--only", "kiln-packed-graphs"])
    assert "CUDA graphs need --accelerator cuda" in capsys.readouterr().err


@pytest.mark.slow  # two trainings in processes of their own
def test_the_precision_reaches_kiln_and_a_peer_run_under_a_given_interpreter(tmp_path):
    """``--peer-python``: no peers' environment is built (a machine without a package index),
    the peer runs under the interpreter given; both variants train in bf16 AMP."""
    corpus = write_tiny_corpus(tmp_path / "corpus")
    out = tmp_path / "lm.json"
    env = {**os.environ, "KILN_CORPUS": str(corpus)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_peers_lm.py"), "--smoke",
         "--only", "kiln-packed,lightning", "--precision", "bf16-mixed",
         "--peer-python", sys.executable, "--env-dir", str(tmp_path / "no-env"),
         "--json", str(out)],
        capture_output=True, text=True, timeout=1500, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (tmp_path / "no-env").exists()
    assert json.loads(out.read_text())["info"]["precision"] == "bf16-mixed"
