"""A causal LM's throughput counts real tokens: ``tokens_per_s`` is the tokens the loss counts
over the measured steps' time, and ``padding_fraction`` the share of their positions that held
padding, whether the rows are padded one document a row or packed."""

from __future__ import annotations

from typing import Any

import pytest
from test_packing import documents, float64_model, packed_batch, unpacked_rows
from torch.utils.data import DataLoader, default_collate

from kiln.core import TrainerConfig, fit

STEPS = 3


def telemetry(rows: Any, warmup_steps: int) -> dict:
    model = float64_model("gpt2-tiny-lm")
    model.train_dataloader = lambda: DataLoader(rows, batch_size=2, collate_fn=default_collate)
    model.val_dataloader = lambda: None
    cfg = TrainerConfig(
        accelerator="cpu", precision="64-true", max_steps=STEPS, warmup_steps=warmup_steps,
        accumulate_grad_batches=len(rows) // 2, progress=False,
    )  # fmt: skip
    return dict(fit(model, cfg).telemetry)


@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize("warmup_steps", [0, 1])
def test_tokens_per_second_and_padding_fraction_count_real_tokens(
    layout: str, warmup_steps: int
) -> None:
    batch = packed_batch(documents(8), "whole")  # whole: several rows end in padding
    rows = unpacked_rows(batch)
    if layout == "packed":
        rows = [{k: v[i] for k, v in batch.items()} for i in range(len(batch["input_ids"]))]
    rows = rows[: len(rows) // 2 * 2]  # every window holds every row
    positions = sum(row["input_ids"].numel() for row in rows)
    if layout == "packed":
        padding = sum(int((row["document_ids"] == -1).sum()) for row in rows)
    else:
        padding = sum(int((row["attention_mask"] == 0).sum()) for row in rows)
    # the loss counts every token but a piece's first (it has nothing to predict it from)
    counted = sum(int((row["labels"][1:] != -100).sum()) for row in rows)
    assert 0 < padding < positions

    tel = telemetry(rows, warmup_steps)
    measured = STEPS - warmup_steps
    assert tel["measured_steps"] == measured
    assert tel["padding_fraction"] == padding / positions  # the same rows every step
    seconds = sum(tel["step_times_s"])
    assert tel["tokens_per_s"] * seconds == pytest.approx(measured * counted, rel=1e-9)
