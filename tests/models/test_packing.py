"""Packing is exact: in float64 a packed batch gives each document piece the loss and the
model the gradients that the same pieces give run one per row, unpadded (<= 1e-12), on
the tiny Llama (rotary positions, GQA) and GPT-2 (absolute positions); training with
packing equals the same token-weighted training on the pieces one per (padded) row.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from kiln.core import TrainerConfig, fit
from kiln.models.data import IGNORE_INDEX, CausalLMData
from kiln.models.data.packing import pack_documents, pieces_of
from kiln.models.testing import tiny_model
from kiln.models.tokens import token_nll

MODELS = ["llama-tiny-lm", "gpt2-tiny-lm"]
MAX_LENGTH = 24
# make test checks each model and each policy once; every pair runs in make test-all
FAST_PAIRS = {("llama-tiny-lm", "best_fit"), ("gpt2-tiny-lm", "carry"), ("gpt2-tiny-lm", "whole")}
PAIRS = [
    pytest.param(name, policy, marks=() if (name, policy) in FAST_PAIRS else pytest.mark.long)
    for name in MODELS
    for policy in ("carry", "whole", "best_fit")
]


def documents(n: int = 11, seed: int = 0) -> list[list[int]]:
    """Random token ids of lengths 1 to 2.5 rows (some split by any policy)."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 60, (n,), generator=generator).tolist()
    return [torch.randint(5, 1000, (k,), generator=generator).tolist() for k in lengths]


def float64_model(name: str, attn_implementation: str = "sdpa"):
    """The tiny model in float64 without dropout, from the same seeded weights each call."""
    torch.manual_seed(0)
    model = tiny_model(name, attn_implementation=attn_implementation)
    model.model.apply(lambda m: setattr(m, "p", 0.0) if isinstance(m, torch.nn.Dropout) else None)
    return model.double()


def packed_batch(docs: list[list[int]], policy: str) -> dict[str, torch.Tensor]:
    arrays, _ = pack_documents(docs, MAX_LENGTH, pad_token_id=0, policy=policy, seed=1)
    return {k: torch.from_numpy(v) for k, v in arrays.items()}


def pieces(batch: dict[str, torch.Tensor]) -> list[tuple[int, int, int]]:
    return pieces_of(batch["document_ids"])


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("policy", ["carry", "whole", "best_fit"])
def test_packing_places_every_token_once_in_order(policy: str) -> None:
    docs = documents()
    batch = packed_batch(docs, policy)
    got: dict[int, list[int]] = {}
    for row, start, end in pieces(batch):
        doc = int(batch["document_ids"][row, start])
        got.setdefault(doc, []).extend(batch["input_ids"][row, start:end].tolist())
        assert batch["position_ids"][row, start:end].tolist() == list(range(end - start))
        assert batch["labels"][row, start] == IGNORE_INDEX
        assert (
            batch["labels"][row, start + 1 : end].tolist()
            == batch["input_ids"][row, start + 1 : end].tolist()
        )
    assert got == dict(enumerate(docs))
    pad = batch["document_ids"] == -1
    assert (batch["labels"][pad] == IGNORE_INDEX).all()
    if policy != "carry":  # a document that fits a row sits in one row
        for doc, tokens in enumerate(docs):
            if len(tokens) <= MAX_LENGTH:
                assert (batch["document_ids"] == doc).any(1).sum() == 1
    else:  # every row but the last is full
        assert not pad[:-1].any()


@pytest.mark.parametrize(("name", "policy"), PAIRS)
def test_packed_losses_and_gradients_equal_one_piece_per_row(name: str, policy: str) -> None:
    model = float64_model(name)
    batch = packed_batch(documents(), policy)
    nll, counted = token_nll(
        model.model(**model.model_inputs(batch)).logits[:, :-1], batch["labels"][:, 1:]
    )
    nll.sum().backward()
    packed_grads = grads(model)
    model.zero_grad()

    reference_sum = torch.zeros((), dtype=torch.float64)
    for row, start, end in pieces(batch):
        ids = batch["input_ids"][row : row + 1, start:end]
        piece = model.token_nll({"input_ids": ids, "labels": ids})[0]  # unpadded, no mask
        packed = nll[row, start : end - 1]  # the labels of tokens start+1 .. end-1
        torch.testing.assert_close(packed, piece[0], rtol=0.0, atol=1e-12)
        reference_sum = reference_sum + piece.sum()
    reference_sum.backward()
    assert counted.sum() == sum(end - start - 1 for _, start, end in pieces(batch))
    want = grads(model)
    assert packed_grads.keys() == want.keys()
    for key, value in want.items():
        torch.testing.assert_close(packed_grads[key], value, rtol=0.0, atol=1e-12, msg=key)


def test_best_fit_fills_the_rows_whole_leaves_half_empty() -> None:
    """Best-fit decreasing: a piece goes into the fullest row that still holds it."""
    docs = [[7] * n for n in (6, 5, 4, 3, 2)]
    whole = pack_documents(docs, 8, 0, policy="whole", seed=0)[1]
    best = pack_documents(docs, 8, 0, policy="best_fit", seed=0)[1]
    assert (whole.rows, best.rows) == (4, 3)  # 6+2, 5+3, 4: the least rows 20 tokens need
    assert best.padding_fraction == pytest.approx(1 - 20 / 24)
    many = documents(400, seed=5)  # 1 to 2.5 rows each: the remainders fill the gaps
    whole, best = (pack_documents(many, MAX_LENGTH, 0, policy=p, seed=0)[1] for p in
                   ("whole", "best_fit"))  # fmt: skip
    assert best.tokens == whole.tokens and best.pieces == whole.pieces
    assert best.rows < whole.rows and best.padding_fraction < whole.padding_fraction / 2


def test_packing_order_is_seeded() -> None:
    docs = documents()
    same = [pack_documents(docs, MAX_LENGTH, 0, seed=3)[0]["input_ids"] for _ in range(2)]
    other = pack_documents(docs, MAX_LENGTH, 0, seed=4)[0]["input_ids"]
    assert (same[0] == same[1]).all()
    assert same[0].shape != other.shape or (same[0] != other).any()


def test_eager_attention_takes_the_additive_mask() -> None:
    docs = documents()
    batch = packed_batch(docs, "carry")
    sdpa, eager = float64_model("gpt2-tiny-lm"), float64_model("gpt2-tiny-lm", "eager")
    torch.testing.assert_close(
        eager.loss_and_count(batch)[0], sdpa.loss_and_count(batch)[0], rtol=0.0, atol=1e-12
    )


def unpacked_rows(batch: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """The packed pieces one per row, right-padded to the row length (the unpacked path)."""
    rows = []
    for row, start, end in pieces(batch):
        ids = torch.zeros(MAX_LENGTH, dtype=torch.long)
        ids[: end - start] = batch["input_ids"][row, start:end]
        mask = (torch.arange(MAX_LENGTH) < end - start).long()
        labels = ids.masked_fill(mask == 0, IGNORE_INDEX)
        rows.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return rows


def train(name: str, rows: Any, steps: int) -> dict[str, torch.Tensor]:
    """kiln's fit in float64, each step one window holding every row (micro-batches of 1)."""
    model = float64_model(name)
    model.train_dataloader = lambda: DataLoader(rows, batch_size=1, collate_fn=default_collate)
    model.val_dataloader = lambda: None
    cfg = TrainerConfig(
        accelerator="cpu", precision="64-true", accumulate_grad_batches=len(rows),
        max_steps=steps, log_every_n_steps=1, progress=False,
    )  # fmt: skip
    fit(model, cfg)
    return {k: v.detach() for k, v in model.state_dict().items()}


@pytest.mark.long  # 20-45 s each; the fast tier compares the losses and gradients above
@pytest.mark.parametrize("policy", ["best_fit", "whole", "carry"])
@pytest.mark.parametrize("name", MODELS)
def test_training_packed_equals_training_one_piece_per_row(name: str, policy: str) -> None:
    batch = packed_batch(documents(), policy)
    packed = [{k: v[i] for k, v in batch.items()} for i in range(len(batch["input_ids"]))]
    got = train(name, packed, steps=3)
    want = train(name, unpacked_rows(batch), steps=3)
    for key, value in want.items():
        if value.is_floating_point():
            torch.testing.assert_close(got[key], value, rtol=0.0, atol=1e-12, msg=key)
    start = float64_model(name).state_dict()
    moved = any(not torch.equal(start[k], v) for k, v in want.items() if v.is_floating_point())
    assert moved


def test_packed_data_module_rows_and_stats(tiny_data_text) -> None:
    data = tiny_data_text
    model = tiny_model("llama-tiny-lm", data=data)
    batch = next(iter(model.train_dataloader()))
    assert batch["input_ids"].shape == (data.batch_size, data.max_length)
    assert set(batch) == {"input_ids", "labels", "position_ids", "document_ids"}
    stats = data.packing_stats["train"]
    assert stats.rows == len(data.train_set) and stats.policy == "best_fit"
    assert stats.split_documents == 0  # the generated sentences all fit a row
    assert stats.padding_fraction < 0.15  # 26 rows of 32 for 739 tokens (24 is the least)
    loss, count = model.loss_and_count(batch)
    assert count == model.count_items(batch) == (batch["labels"][:, 1:] != IGNORE_INDEX).sum()
    assert torch.isfinite(loss)


PACKED_TEXT: dict[str, Any] = {"num_train": 64, "num_val": 16, "batch_size": 2, "max_length": 32}


@pytest.fixture
def tiny_data_text() -> CausalLMData:
    return CausalLMData(packing=True, **PACKED_TEXT)


def test_the_defaults_keep_every_document_that_fits_a_row_whole(tmp_path) -> None:
    # a 58-token document split 15 + 43 by carry scores 505 nats, whole 514: the defaults
    # never split one that fits, so each document's loss is the one it gets alone
    assert CausalLMData(packing=True).packing_policy == "best_fit"
    shard = tmp_path / "train.jsonl"
    shard.write_text('{"text": "a b"}\n')
    streamed = CausalLMData(packing=True, streaming=True, data_files=str(shard), val_split=None)
    assert streamed.packing_policy == "whole"
    docs = [[9] * n for n in (15, 20, 10, 24, 3, 17, 8)]  # every one fits a row of 24
    for policy in ("best_fit", "whole"):
        _, stats = pack_documents(docs, MAX_LENGTH, 0, policy=policy, seed=0)
        assert (stats.split_documents, stats.pieces) == (0, len(docs))
    assert pack_documents(docs, MAX_LENGTH, 0, seed=0)[1].policy == "best_fit"
    assert pack_documents(docs, MAX_LENGTH, 0, policy="carry", seed=0)[1].split_documents > 0


def test_validation_keeps_the_first_max_val_tokens_tokens() -> None:
    data = CausalLMData(packing=True, max_val_tokens=100, **PACKED_TEXT)
    tiny_model("llama-tiny-lm", data=data).val_dataloader()
    stats = data.packing_stats["validation"]
    assert stats.tokens == 100 and stats.documents < PACKED_TEXT["num_val"]
    padded = CausalLMData(max_val_tokens=100, **PACKED_TEXT)
    tiny_model("llama-tiny-lm", data=padded).val_dataloader()
    tokens = padded.val_set[:]["attention_mask"].sum(1)
    assert tokens.sum() >= 100 and tokens[:-1].sum() < 100  # documents until 100 tokens
    with pytest.raises(ValueError, match="max_val_tokens=0 must be >= 1"):
        CausalLMData(max_val_tokens=0)


def test_bad_packing_requests_fail_naming_what_is_valid() -> None:
    with pytest.raises(ValueError, match=r"packing_policy='fill'.*carry, whole, best_fit"):
        CausalLMData(packing=True, packing_policy="fill")
    with pytest.raises(ValueError, match=r"'best_fit' packs a whole data set.*carry or whole"):
        CausalLMData(packing=True, packing_policy="best_fit", streaming=True)
    with pytest.raises(ValueError, match=r"padding='buckets'.*padding=max_length"):
        CausalLMData(packing=True, padding="buckets")

    class NoPacking:
        tokenizer = tiny_model("llama-tiny-lm").tokenizer

    with pytest.raises(TypeError, match=r"packing=true needs a model.*NoPacking"):
        CausalLMData(packing=True).attach(NoPacking())
    model = tiny_model("llama-tiny-lm")
    model.model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match=r"'flash_attention_2' does not.*sdpa, eager"):
        model.check_packing()
    with pytest.raises(ValueError, match="no document to pack"):
        pack_documents([[], []], 8, pad_token_id=0)


@pytest.mark.parametrize("name", MODELS)
def test_packed_training_step_is_one_graph_for_every_layout(name: str) -> None:
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    model = tiny_model(name)
    counter = CompileCounter()
    step = torch.compile(
        lambda b: model.training_step(b, 0)["loss"], backend=counter, fullgraph=True
    )
    for seed in range(3):  # other documents: other piece boundaries, the same shapes
        arrays, _ = pack_documents(documents(seed=seed), MAX_LENGTH, pad_token_id=0, seed=seed)
        batch = {k: torch.from_numpy(v[:2]) for k, v in arrays.items()}
        assert torch.isfinite(step(batch))
    assert counter.frame_count == 1  # compiled once: no graph break, no recompile
