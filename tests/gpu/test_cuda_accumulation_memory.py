"""On a GPU, peak memory at accumulate 8 equals accumulate 1 within one micro-batch:
micro-batches reach the device one at a time (plus the next, prefetched).

Marked ``gpu``: deselected by ``make test``, skipped without a CUDA device.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from kiln.core import TrainerConfig, fit

pytestmark = pytest.mark.gpu

FEATURES, BATCH = 4096, 256  # a 4 MiB micro-batch against a 16 KiB model


class WideInput(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(FEATURES, 1)
        n = 16 * BATCH
        self.data = TensorDataset(torch.randn(n, FEATURES), torch.randn(n, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return {"loss": F.mse_loss(self.net(x), y), "num_items": x.shape[0]}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=BATCH, drop_last=True, pin_memory=True)


def peak_bytes(accumulate: int) -> int:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    trainer = TrainerConfig(
        max_steps=2, accumulate_grad_batches=accumulate, accelerator="cuda", progress=False
    )
    fit(WideInput(), trainer)
    return torch.cuda.max_memory_allocated()


def test_peak_memory_at_accumulate_8_equals_accumulate_1_within_a_micro_batch():
    micro_batch = BATCH * (FEATURES + 1) * 4
    one, eight = peak_bytes(1), peak_bytes(8)
    assert eight <= one + micro_batch * 1.1, (one, eight, micro_batch)
