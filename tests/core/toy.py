"""Tiny LightningModules for kiln.core's tests (importable by spawned workers too)."""

from __future__ import annotations

import os
import time

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

VOCAB = 11
PAD = 0


class ToySequences(Dataset):
    """Padded token sequences of random lengths: per-item losses weight by token count."""

    def __init__(self, n: int, max_len: int = 8, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, VOCAB, (n, max_len), generator=g)
        lengths = torch.randint(1, max_len + 1, (n,), generator=g)
        mask = torch.arange(max_len)[None, :] < lengths[:, None]
        self.ids[~mask] = PAD
        self.labels = torch.randint(0, VOCAB, (n, max_len), generator=g)
        self.labels[~mask] = -100

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


class CountedDataset(Dataset):
    """Counts the samples loaded from ``data`` (a resume must not load skipped ones)."""

    def __init__(self, data: Dataset) -> None:
        self.data, self.calls = data, 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        self.calls += 1
        return self.data[i]


def count_loads(module: ToyTokenModule) -> CountedDataset:
    """Make ``module`` train on a :class:`CountedDataset` of its ``data``, and return it: after
    a resumed ``fit``, its ``calls`` are the samples trained since the checkpoint."""
    counted = CountedDataset(module.data)
    setattr(module, "data", counted)  # noqa: B010 (the toy's data is typed ToySequences)
    return counted


class ToyTokenModule(L.LightningModule):
    """Per-token classifier whose loss averages over non-padding tokens."""

    items_are_tokens = True

    def __init__(
        self,
        n: int = 32,
        batch_size: int = 4,
        lr: float = 0.1,
        shuffle: bool = False,
        dropout: float = 0.0,
        scheduler: bool = False,
        momentum: float = 0.0,
        step_sleep: float = 0.0,
        optimizer: str = "sgd",
    ) -> None:
        super().__init__()
        torch.manual_seed(1234)
        self.embed = torch.nn.Embedding(VOCAB, 16)
        self.drop = torch.nn.Dropout(dropout)
        self.head = torch.nn.Linear(16, VOCAB)
        self.data = ToySequences(n)
        self.val_data = ToySequences(10, seed=1)
        self.batch_size, self.lr, self.shuffle = batch_size, lr, shuffle
        self.use_scheduler, self.momentum = scheduler, momentum
        self.optimizer_name = optimizer
        self.step_sleep = float(os.environ.get("KILN_TEST_STEP_SLEEP", step_sleep))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(self.embed(input_ids)))

    def token_loss_sum(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self(batch["input_ids"])
        loss = F.cross_entropy(
            logits.flatten(0, 1), batch["labels"].flatten(), reduction="sum", ignore_index=-100
        )
        return loss, (batch["labels"] != -100).sum()

    def training_step(self, batch, batch_idx):
        if self.step_sleep:
            time.sleep(self.step_sleep)
        loss_sum, n = self.token_loss_sum(batch)
        return {"loss": loss_sum / n, "num_items": n}

    def count_items(self, batch) -> torch.Tensor:
        return (batch["labels"] != -100).sum()

    def validation_step(self, batch, batch_idx):
        logits = self(batch["input_ids"])
        nll = F.cross_entropy(
            logits.transpose(1, 2), batch["labels"], reduction="none", ignore_index=-100
        ).sum(1)
        return {"nll": nll, "tokens": (batch["labels"] != -100).sum(1)}

    def validation_metrics(self, outputs):
        return {
            "nll": (outputs["nll"].sum() / outputs["tokens"].sum()).item(),
            "samples": float(len(outputs["nll"])),
        }

    def configure_optimizers(self):
        opt = make_optimizer(self, self.optimizer_name)
        if not self.use_scheduler:
            return opt
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": sched}

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size, shuffle=self.shuffle)

    def val_dataloader(self):
        return DataLoader(self.val_data, batch_size=4)


def make_optimizer(module: ToyTokenModule, name: str) -> torch.optim.Optimizer:
    """The toy's optimizer; the plain-PyTorch references build theirs here too."""
    if name == "adamw":
        return torch.optim.AdamW(module.parameters(), lr=module.lr, weight_decay=0.01)
    if name == "sgd":
        return torch.optim.SGD(module.parameters(), lr=module.lr, momentum=module.momentum)
    raise ValueError(f"optimizer={name!r} is not valid; use 'sgd' or 'adamw'")


def reference_run(
    module: ToyTokenModule, window_samples: list[int], clip: float | None = None
) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Plain PyTorch in float64: one optimizer step per window, on one batch holding the
    whole window (samples in dataset order, epoch after epoch).

    Returns:
        The final weights and each window's token-weighted mean loss.
    """
    module = module.double()
    opt = make_optimizer(module, module.optimizer_name)
    n = len(module.data)
    losses = []
    start = 0
    for size in window_samples:
        index = torch.arange(start, start + size) % n
        start += size
        batch = {"input_ids": module.data.ids[index], "labels": module.data.labels[index]}
        loss_sum, count = module.token_loss_sum(batch)
        loss = loss_sum / count
        loss.backward()
        losses.append(loss.item())
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
        opt.step()
        opt.zero_grad()
    return weights(module), losses


def weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


class ToyBlock(torch.nn.Module):
    """A residual block: what FSDP shards as one unit, and regional compile compiles."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(width, width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + torch.tanh(self.linear(h))


class ToyBlocksModule(ToyTokenModule):
    """The token toy with a stack of repeated blocks between its embedding and its head."""

    def __init__(self, blocks: int = 2, **kw) -> None:
        super().__init__(**kw)
        self.blocks = torch.nn.ModuleList(ToyBlock(16) for _ in range(blocks))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.embed(input_ids))
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def full_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's whole weights, also when FSDP sharded them (collective: every rank)."""
    from torch.distributed.tensor import DTensor

    return {
        k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
        for k, v in module.state_dict().items()
    }
