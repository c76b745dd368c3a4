"""Training on a stream: an ``IterableDataset`` in a loader that saves and restores where it
stands (``state_dict()`` / ``load_state_dict()``, as torchdata's ``StatefulDataLoader``).

kiln cannot skip a stream's consumed batches at a sampler (it has none), so the loader's own
state goes into every checkpoint, one entry per rank, and a resume hands each rank its entry
back before the first batch. With workers the loader's state is each worker's dataset
state as of the last batch the loop took, so batches prefetched but not trained on are
produced again after a resume.

A stream is endless to the loop: it has no length, so the run trains for
``trainer.max_steps`` (``max_epochs`` is refused) and ``epoch`` stays 0; passes over the
data are the stream's business. Its order belongs to the world that wrote it (each rank and
worker reads its own slice), so a resume on another world size or worker count is refused.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Protocol, cast

import torch.distributed as dist
from lightning.fabric import Fabric
from torch.utils.data import DataLoader, IterableDataset

from kiln.core.config import TrainerConfig

STATE_KEY = "train_stream"
"""The checkpoint key of the streams' states: ``world_size``, ``num_workers`` and ``ranks``
(each rank's ``loader.state_dict()``, by global rank)."""


class _Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def is_stream(loader: DataLoader[Any]) -> bool:
    """Whether the training loader reads an ``IterableDataset``."""
    return isinstance(loader.dataset, IterableDataset)


def check_stream(loader: DataLoader[Any], trainer: TrainerConfig) -> None:
    """Refuse a stream whose position a checkpoint could not hold, or a run it cannot end.

    Raises:
        TypeError: The loader has no ``state_dict()`` and ``load_state_dict()``.
        ValueError: ``trainer.max_epochs`` is set (a stream has no epoch length).
    """
    if not all(callable(getattr(loader, m, None)) for m in ("state_dict", "load_state_dict")):
        raise TypeError(
            f"train_dataloader() returns a {type(loader).__name__} over an IterableDataset: "
            "kiln trains on a stream only from a loader whose position checkpoints can hold "
            "(state_dict() and load_state_dict(), e.g. torchdata's StatefulDataLoader); use "
            "one, or a map-style dataset"
        )
    if trainer.max_epochs is not None:
        raise ValueError(
            f"trainer.max_epochs={trainer.max_epochs} cannot end a run on a stream (it has no "
            "epoch length); set trainer.max_epochs=null and train for trainer.max_steps"
        )


def stream_batches_per_epoch(loader: DataLoader[Any]) -> int:
    """Micro-batches per epoch: the loader's length, or for a stream as many as any run takes."""
    return sys.maxsize if is_stream(loader) else len(loader)


class StreamPosition:
    """Every rank's stream position, as the checkpoint entry :data:`STATE_KEY`: saved by
    every rank (a collective), restored into this rank's loader before it is iterated.

    Raises (on load):
        ValueError: The checkpoint holds no stream position, or one of another world size or
            worker count.
    """

    def __init__(self, fabric: Fabric, loader: DataLoader[Any]) -> None:
        self.fabric, self.loader = fabric, loader
        self.path: Path | None = None  # the checkpoint being loaded, for the messages

    def state_dict(self) -> dict[str, Any]:
        return gather_stream_state(self.fabric, self.loader)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        restore_stream(self.fabric, self.loader, {STATE_KEY: state}, self.path)

    def load_missing(self, path: Path) -> None:
        restore_stream(self.fabric, self.loader, {}, path)


def gather_stream_state(fabric: Fabric, loader: DataLoader[Any]) -> dict[str, Any]:
    """Every rank's stream position (:data:`STATE_KEY`'s value); a collective."""
    local = cast(_Stateful, loader).state_dict()
    ranks: list[Any] = [local]
    if fabric.world_size > 1 and dist.is_available() and dist.is_initialized():
        ranks = [None] * fabric.world_size
        dist.all_gather_object(ranks, local)
    return {"world_size": fabric.world_size, "num_workers": loader.num_workers, "ranks": ranks}


def restore_stream(
    fabric: Fabric, loader: DataLoader[Any], rest: dict[str, Any], path: Path | None
) -> None:
    """Give this rank's loader its position from the checkpoint's ``rest`` (before it is
    iterated).

    Raises:
        ValueError: The checkpoint holds no stream position, or one of another world size or
            worker count.
    """
    saved = rest.get(STATE_KEY)
    if saved is None:
        raise ValueError(
            f"checkpoint {path} holds no position of the training stream (it was written by a "
            "run on map-style data, or without it); resume it with the data it was trained on, "
            "or start over in a new checkpoint_dir"
        )
    world, workers = fabric.world_size, loader.num_workers
    if (saved["world_size"], saved["num_workers"]) != (world, workers):
        raise ValueError(
            f"checkpoint {path} holds a stream read by {saved['world_size']} processes x "
            f"{saved['num_workers']} DataLoader workers, this run has {world} x {workers}: each "
            "reads its own slice of the shards, so the stream continues exactly only as it was; "
            f"resume with trainer.devices x num_nodes = {saved['world_size']} and "
            f"data.num_workers={saved['num_workers']}"
        )
    cast(_Stateful, loader).load_state_dict(saved["ranks"][fabric.global_rank])
