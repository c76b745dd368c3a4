"""``64-true`` is exact for kiln.models' wrappers (causal LM, classifier, masked LM, QA,
seq2seq, token classification): a window of micro-batches (variable-length, padded rows of
each model's tiny data) updates the weights as one big batch does in a plain PyTorch
float64 AdamW loop, to <= 1e-12, and the logged loss is the window's token-weighted mean.
The losses must only ever promote (``.float()`` would down-cast)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from kiln.core import TrainerConfig, fit
from kiln.models.module import at_least_fp32
from kiln.models.testing import tiny_model

NEW_TASKS = ["bert-tiny-mlm", "bert-tiny-qa", "t5-tiny-seq2seq", "bart-tiny-seq2seq"]
NEW_TASKS += ["bert-tiny-token-cls"]
# make test runs each task's loss in one accumulated window and the partial window on the
# causal LM, the classifier and seq2seq; the other combinations run in make test-all
LONG = pytest.mark.long


def _tasks(fast: set[str]) -> list:
    return [pytest.param(n, marks=() if n in fast else LONG) for n in NEW_TASKS]


def no_dropout(name: str) -> dict[str, float]:
    """``config_overrides`` that switch every dropout of the model's HF config off."""
    config = tiny_model(name).model.config.to_dict()
    return {
        key: 0.0
        for key, value in config.items()
        if isinstance(value, float) and ("dropout" in key or "pdrop" in key)
    }


def rows(name: str, n: int) -> list[dict[str, torch.Tensor]]:
    """``n`` rows of the model's tiny data as its loader hands them out (variable-length
    text, padded; masked LM rows already masked), cycling epochs for more rows. Seeded as a
    run seeds before it builds its data (``trainer.seed``): the masks are drawn from torch's
    generator, whose state would otherwise be what earlier tests of the process left."""
    torch.manual_seed(0)
    loader = tiny_model(name, data=True).data_module.train_dataloader()
    out: list[dict[str, torch.Tensor]] = []
    while len(out) < n:
        for batch in loader:
            out += [
                {k: v[i] for k, v in batch.items()} for i in range(len(next(iter(batch.values()))))
            ]
    return out[:n]


def build(name: str, data: list[dict], batch_size: int):
    torch.manual_seed(0)  # both copies start from the same weights
    model = tiny_model(name, config_overrides=no_dropout(name))
    # Train on fixed rows in order; no validation (the loss path is what is tested here).
    model.train_dataloader = lambda: DataLoader(data, batch_size=batch_size)
    model.val_dataloader = lambda: None
    return model


def reference(name: str, data: list[dict], windows: list[int]) -> tuple[dict, list[float]]:
    """Plain PyTorch float64: one AdamW step (the module's own settings) per big batch."""
    model = build(name, data, 1).double()
    model.total_steps = len(windows)
    configured = model.configure_optimizers()
    opt, sched = configured["optimizer"], configured["lr_scheduler"]
    losses, start = [], 0
    for size in windows:
        batch = default_collate(data[start : start + size])
        start += size
        loss, _ = model.loss_and_count(batch)
        loss.backward()
        losses.append(loss.item())
        opt.step()
        sched.step()
        opt.zero_grad()
    return {k: v.detach() for k, v in model.state_dict().items()}, losses


def check(name: str, n: int, accumulate: int, windows: list[int], **trainer_kw) -> None:
    b = 2
    data = rows(name, n)
    model = build(name, data, b)
    cfg = TrainerConfig(
        accelerator="cpu",
        precision="64-true",
        accumulate_grad_batches=accumulate,
        log_every_n_steps=1,
        progress=False,
        **trainer_kw,
    )
    result = fit(model, cfg)
    want, losses = reference(name, data, windows)
    assert result.global_step == len(windows)
    for key, value in model.state_dict().items():
        if value.is_floating_point():
            assert value.dtype == torch.float64, key
            torch.testing.assert_close(value, want[key], rtol=0.0, atol=1e-12)
    logged = [row["train/loss"] for row in result.history]
    assert logged == pytest.approx(losses, rel=0.0, abs=1e-12)


@pytest.mark.parametrize(
    "accumulate",
    [
        pytest.param(1, marks=LONG),
        pytest.param(2, marks=LONG),
        4,
        pytest.param(8, marks=pytest.mark.slow),
    ],
)
def test_causal_lm_window_equals_one_big_batch_in_float64(accumulate: int) -> None:
    check("llama-tiny-lm", 2 * accumulate * 5, accumulate, [2 * accumulate] * 5, max_steps=5)


@pytest.mark.parametrize("accumulate", [pytest.param(1, marks=LONG), 4])
def test_classifier_window_equals_one_big_batch_in_float64(accumulate: int) -> None:
    check("bert-tiny-cls", 2 * accumulate * 5, accumulate, [2 * accumulate] * 5, max_steps=5)


@pytest.mark.parametrize("name", ["llama-tiny-lm", "bert-tiny-cls"])
def test_partial_last_window_in_float64(name: str) -> None:
    # 9 micro-batches of 2, windows of 4: [8, 8, 2] in one epoch
    check(name, 18, 4, [8, 8, 2], max_steps=10, max_epochs=1)


@pytest.mark.parametrize("name", _tasks(set(NEW_TASKS) - {"bart-tiny-seq2seq"}))
def test_task_window_equals_one_big_batch_in_float64(name: str) -> None:
    check(name, 2 * 4 * 3, 4, [8] * 3, max_steps=3)


@pytest.mark.parametrize("name", _tasks({"bart-tiny-seq2seq"}))
def test_task_partial_last_window_in_float64(name: str) -> None:
    # 5 micro-batches of 2, windows of 4: [8, 2] in one epoch
    check(name, 10, 4, [8, 2], max_steps=10, max_epochs=1)


def test_losses_promote_and_never_down_cast() -> None:
    for dtype, want in [
        (torch.float64, torch.float64),
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.float32),
    ]:
        assert at_least_fp32(torch.ones(2, dtype=dtype)).dtype == want
