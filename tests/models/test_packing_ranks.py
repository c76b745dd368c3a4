"""Packed training on two gloo ranks equals the same token-weighted training without packing
on one: in float64, the weights after several accumulated steps agree within 1e-12.

The two ranks hold rows with different numbers of counted tokens, so the update is right only
if the window's tokens are counted over both ranks (``docs/loop.md``); the reference trains
the same pieces one per right-padded row, on one process.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_packing import documents, float64_model, packed_batch, unpacked_rows
from torch.utils.data import DataLoader, default_collate

from kiln.core import TrainerConfig, fit, launch

STEPS = 3


def train(name: str, rows: Any, devices: int) -> dict[str, Any]:
    """kiln's fit in float64, micro-batches of one row, each step a window over every row of
    every rank. Top-level so spawned workers can import it."""
    model = float64_model(name)
    model.train_dataloader = lambda: DataLoader(rows, batch_size=1, collate_fn=default_collate)
    model.val_dataloader = lambda: None
    cfg = TrainerConfig(
        accelerator="cpu", devices=devices, precision="64-true",
        accumulate_grad_batches=len(rows) // devices, max_steps=STEPS, log_every_n_steps=1,
        progress=False,
    )  # fmt: skip
    result = fit(model, cfg)
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {"weights": weights, "telemetry": result.telemetry}


@pytest.mark.long  # a 2-rank launch; test_fsdp.py proves windows over unequal token counts per rank
def test_packed_training_on_two_ranks_equals_unpacked_training_on_one() -> None:
    batch = packed_batch(documents(8), "carry")
    packed = [{k: v[i] for k, v in batch.items()} for i in range(len(batch["input_ids"]))]
    assert len(packed) % 2 == 0  # an odd count would make the sampler repeat a row
    counted = [int((row["labels"][1:] != -100).sum()) for row in packed]
    assert counted[0::2] != counted[1::2]  # the ranks hold different token counts
    want = train("llama-tiny-lm", unpacked_rows(batch), devices=1)["weights"]
    ranks = launch(train, 2, "llama-tiny-lm", packed, 2)
    assert len(ranks) == 2
    for rank in ranks:
        for key, value in want.items():
            if value.is_floating_point():
                torch.testing.assert_close(
                    rank["weights"][key], value, rtol=0.0, atol=1e-12, msg=key
                )
        # every rank reports the padding of both ranks' rows: only the last row has any
        padding = int((batch["document_ids"] == -1).sum())
        assert rank["telemetry"]["padding_fraction"] == padding / batch["input_ids"].numel()
    start = float64_model("llama-tiny-lm").state_dict()
    assert any(not torch.equal(start[k], v) for k, v in want.items() if v.is_floating_point())
