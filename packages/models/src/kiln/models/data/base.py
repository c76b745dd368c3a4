"""What every kiln data module shares: loaders with static shapes, workers, caching."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from kiln.models.data.fingerprint import DataIdentity, fingerprint

IGNORE_INDEX = -100
"""Label value the losses and metrics skip (padding tokens, validation padding samples)."""


def default_cache_dir() -> Path:
    """Where kiln caches generated and tokenized datasets (``$KILN_CACHE`` or ~/.cache/kiln)."""
    return Path(os.environ.get("KILN_CACHE", Path.home() / ".cache" / "kiln"))


def world_size() -> int:
    """Processes in the job (1 outside torch.distributed)."""
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class PaddedValidationSet(Dataset):
    """A validation set padded to a multiple of ``multiple`` so every batch has one shape.

    The padding rows copy row 0 with every label set to ``IGNORE_INDEX``; the metrics
    drop them. This keeps compiled validation to one graph, also under DDP.
    """

    def __init__(self, dataset: Any, multiple: int) -> None:
        self.dataset = dataset
        self.num_real = len(dataset)
        self.length = -(-self.num_real // multiple) * multiple

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if index < self.num_real:
            return self.dataset[index]
        return self._padding_row(self.dataset[0])

    def __getitems__(self, indices: list[int]) -> list[dict[str, torch.Tensor]]:
        """A batch's rows, read from an HF dataset in one slice rather than one Arrow lookup
        per row (about 9x less CPU); the DataLoader calls this where it exists."""
        fetch = getattr(self.dataset, "__getitems__", None)
        if fetch is None or not indices:
            return [self[i] for i in indices]
        real = iter(fetch([i for i in indices if i < self.num_real]))
        pad = self._padding_row(self.dataset[0]) if max(indices) >= self.num_real else {}
        return [next(real) if i < self.num_real else dict(pad) for i in indices]

    @staticmethod
    def _padding_row(row: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        item = dict(row)
        item["labels"] = torch.full_like(item["labels"], IGNORE_INDEX)
        return item


class DataModule(L.LightningDataModule):
    """Base of kiln's data modules: batch sizes, workers and the two loaders.

    A ``LightningDataModule``: the Lightning ``Trainer`` takes one as it is, and Lightning's
    hooks (``prepare_data``, ``teardown``, ``state_dict``) are there to override. Subclasses
    implement ``attach`` (check against the model, pick up its tokenizer or
    transforms) and ``setup`` (build ``self.train_set`` / ``self.val_set``, and
    ``self.test_set`` where there is a test split).

    Args:
        batch_size: Training micro-batch size per process (the last partial batch is dropped).
        val_batch_size: Validation batch size (default: ``batch_size``).
        num_workers: DataLoader worker processes (0: load in the main process).
        seed: Seeds generation, splits and the default shuffling.
        allow_changed: Resume a checkpoint whose recorded data (:meth:`data_fingerprint`)
            differs from the data now; ``False`` refuses, naming what changed.
    """

    def __init__(
        self,
        batch_size: int = 32,
        val_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
        allow_changed: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be >= 1")
        if num_workers < 0:
            raise ValueError(f"num_workers={num_workers!r} must be >= 0")
        super().__init__()
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size or batch_size
        self.num_workers = num_workers
        self.seed = seed
        self.allow_changed = allow_changed
        self.train_set: Any = None
        self.val_set: Any = None
        self.test_set: Any = None  # built by ``setup`` where the data module has a test split
        self._is_setup = False
        self._fingerprint: dict[str, Any] | None = None

    def attach(self, module: Any) -> None:
        """Check the data against ``module`` and take what it needs from it."""

    def setup(self, stage: str | None = None) -> None:
        """Build ``train_set`` and ``val_set`` (once, whatever the ``stage``: one build
        serves fitting, validation and testing)."""
        if not self._is_setup:
            self._setup()
            self._is_setup = True

    def _setup(self) -> None:
        raise NotImplementedError

    def data_fingerprint(self) -> dict[str, Any]:
        """What this data feeds the run (taken once, after setup): each local file's path,
        size and content hash, and each split's rows and, for data no local file holds, its
        ``datasets`` fingerprint (``kiln.models.data.fingerprint``)."""
        if self._fingerprint is None:
            self.setup()
            self._fingerprint = fingerprint(self)
        return self._fingerprint

    def checkpoint_state(self) -> dict[str, Any]:
        """What every checkpoint records of the data (``kiln.core``'s registry, through the
        module's ``checkpoint_state``): its fingerprint under ``"data"``, which a resume
        compares with the data now."""
        return {"data": DataIdentity(self)}

    def collate(self, items: list[dict]) -> dict[str, torch.Tensor]:
        return torch.utils.data.default_collate(items)

    def _loader(self, dataset: Any, batch_size: int, train: bool) -> DataLoader:
        generator = torch.Generator().manual_seed(self.seed)
        return DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=train,
            drop_last=train,  # a short last batch is a new shape, so a recompile
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            collate_fn=self.collate,
            generator=generator,
        )

    def train_dataloader(self) -> DataLoader:
        """Shuffled training batches of exactly ``batch_size`` rows."""
        self.setup()
        if len(self.train_set) < self.batch_size:
            raise ValueError(
                f"the training set has {len(self.train_set)} rows, fewer than one batch "
                f"(batch_size={self.batch_size}); lower batch_size or add data"
            )
        return self._loader(self.train_set, self.batch_size, train=True)

    def val_dataloader(self) -> DataLoader:
        """Validation batches, all of ``val_batch_size`` rows (padding rows are ignored)."""
        self.setup()
        padded = PaddedValidationSet(self.val_set, self.val_batch_size * world_size())
        return self._loader(padded, self.val_batch_size, train=False)

    def test_dataloader(self) -> DataLoader:
        """Test batches, as the validation ones; only where the data has a test split.

        Raises:
            ValueError: The data module has no test split (the message says how to get one).
        """
        self.setup()
        if self.test_set is None:
            raise ValueError(
                f"the data module {type(self).__name__} has no test split; give it one "
                "(ImageClassificationData: test_fraction > 0) or use split=validation"
            )
        padded = PaddedValidationSet(self.test_set, self.val_batch_size * world_size())
        return self._loader(padded, self.val_batch_size, train=False)
