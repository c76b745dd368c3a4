"""Device memory does not grow with accumulation: a window is pre-fetched and counted on the
host, and its micro-batches reach the device one at a time (plus the next, prefetched).

On the CPU "the device" is counted, not measured: each batch is a :class:`TrackedBatch` whose
``.to(device)`` (what Fabric's ``move_data_to_device`` calls) makes a device copy that counts
itself alive until garbage. The step records how many copies are alive at each forward.
"""

from __future__ import annotations

import gc

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from kiln.core import TrainerConfig, fit


class TrackedBatch(list):
    """``[x, y]``; ``.to(device)`` returns a copy that counts as device-resident while alive."""

    alive = 0
    on_device = False

    def to(self, device, **kwargs):
        moved = TrackedBatch(t.to(device, **kwargs) for t in self)
        moved.on_device = True
        TrackedBatch.alive += 1
        return moved

    def __del__(self):
        if self.on_device:
            TrackedBatch.alive -= 1


class CountingModule(L.LightningModule):
    """A linear classifier that records the device-resident batches alive at each forward."""

    def __init__(self, batch_size: int = 4, n: int = 64) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(8, 3)
        g = torch.Generator().manual_seed(1)
        self.data = TensorDataset(torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,)))
        self.batch_size = batch_size
        self.alive_at_forward: list[int] = []

    def training_step(self, batch, batch_idx):
        assert batch.on_device, "the step got a batch that never went to the device"
        gc.collect()  # count only batches something still references
        self.alive_at_forward.append(TrackedBatch.alive)
        x, y = batch
        return {"loss": F.cross_entropy(self.net(x), y), "num_items": x.shape[0]}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(
            self.data,
            batch_size=self.batch_size,
            drop_last=True,
            collate_fn=lambda rows: TrackedBatch(torch.stack(c) for c in zip(*rows, strict=True)),
        )


def peak_device_batches(accumulate: int) -> int:
    module = CountingModule()
    TrackedBatch.alive = 0
    trainer = TrainerConfig(
        max_steps=2, accumulate_grad_batches=accumulate, accelerator="cpu", progress=False
    )
    fit(module, trainer)
    assert len(module.alive_at_forward) == 2 * accumulate
    return max(module.alive_at_forward)


@pytest.mark.parametrize("accumulate", [2, pytest.param(8, marks=pytest.mark.long)])
def test_device_batches_alive_do_not_grow_with_accumulation(accumulate) -> None:
    # accumulate 1 holds the batch being trained on; a window adds at most the prefetched next
    assert peak_device_batches(accumulate) <= peak_device_batches(1) + 1
