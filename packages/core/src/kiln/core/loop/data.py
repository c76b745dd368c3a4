"""Data plumbing the loop owns: a training order that depends only on (seed, epoch), and
validation outputs gathered across ranks in dataset order.

The order does not depend on the world size either. Each epoch's permutation is drawn from
``(seed, epoch)`` alone and dealt round-robin (``DistributedSampler``: rank ``r`` takes
positions ``r, r + W, ...``), so the window of ``A`` micro-batches of ``B`` samples that
step ``k`` trains on ``W`` ranks holds positions ``[k·G, (k+1)·G)`` of the permutation, with
``G = W·A·B`` the global batch: the same samples on any world size with the same global
batch. That is what lets a run resume on another number of devices
(``kiln.core.loop.resume``).
Only an epoch's tail can differ: the sampler pads each epoch to a multiple of ``W`` and
``drop_last`` drops a short batch per rank (:func:`epoch_samples`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from itertools import islice
from typing import Any, cast

import torch
from lightning.fabric import Fabric
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
)


class EpochBatches(Sampler[list[int]]):
    """The batches of indices of one epoch, from where the run stands.

    kiln owns the epoch here. Fabric's dataloader wrapper would call
    ``sampler.set_epoch(n)`` with its own count of ``iter()`` calls, which restarts at 0 in a
    resumed process (a run resumed in epoch 1 would replay epoch 0's order), so the training
    loader is never wrapped by Fabric and this class has no ``set_epoch`` for anything to
    call: :meth:`start` is the one way in. Skipping happens on the indices, so a resumed
    run never loads or collates the micro-batches it already trained on.
    """

    def __init__(self, batches: Any) -> None:
        self.batches = batches  # a BatchSampler (or the user's batch sampler)
        self._skip = 0

    def start(self, epoch: int, skip: int = 0) -> None:
        """Point the next iteration at ``epoch``, leaving out its first ``skip`` batches."""
        for sampler in (self.batches, getattr(self.batches, "sampler", None)):
            if sampler is not None and hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
        self._skip = skip

    def __iter__(self) -> Iterator[list[int]]:
        skip, self._skip = self._skip, 0
        return islice(iter(self.batches), skip, None)  # index lists only: cheap

    def __len__(self) -> int:
        return len(self.batches) - self._skip


def training_loader(loader: DataLoader[Any], fabric: Fabric, seed: int) -> DataLoader[Any]:
    """Rebuild ``loader`` with a seeded sampler driven by :class:`EpochBatches`.

    The order of epoch ``e`` is a function of ``(seed, e)`` alone, and iterator creation
    draws no global random numbers, so a run resumed mid-epoch sees exactly the batches
    an uninterrupted run sees. Iterate it with :func:`epoch_batches`.
    """
    if isinstance(loader.dataset, IterableDataset):
        return loader  # a stream keeps its own position (kiln.core.loop.stream)
    if loader.batch_size is None:
        # A custom batch sampler (e.g. length buckets) keeps its own order; Fabric still
        # shards it across ranks. Resume is exact only if it seeds itself by epoch.
        warnings.warn(
            "train_dataloader() uses a custom batch_sampler: kiln keeps it, and mid-epoch "
            "resume is exact only if it orders batches by (seed, epoch) via set_epoch()",
            stacklevel=2,
        )
        # one loader in, one out: Fabric's rebuilt loader, its batch sampler sharded by rank
        # (Fabric and torch annotate these with bare generics)
        wrapped = cast(
            DataLoader[Any],
            fabric.setup_dataloaders(loader, move_to_device=False),  # pyright: ignore[reportUnknownMemberType]
        )
        batches = cast(Sampler[list[int]], wrapped.batch_sampler)  # pyright: ignore[reportUnknownMemberType]
    else:
        sampler: DistributedSampler[int] = DistributedSampler(
            loader.dataset,
            num_replicas=fabric.world_size,
            rank=fabric.global_rank,
            shuffle=isinstance(loader.sampler, RandomSampler),  # pyright: ignore[reportUnknownMemberType]
            seed=seed,
        )
        batches = BatchSampler(sampler, loader.batch_size, loader.drop_last)
    # torch annotates collate_fn and multiprocessing_context with bare generics (Unknown)
    return DataLoader(
        loader.dataset,
        batch_sampler=EpochBatches(batches),
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,  # pyright: ignore[reportUnknownMemberType]
        pin_memory=loader.pin_memory,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,  # pyright: ignore[reportUnknownMemberType]
        prefetch_factor=loader.prefetch_factor,
        persistent_workers=False,
        # Worker seeds come from this generator, reseeded every epoch (see epoch_batches).
        generator=torch.Generator(),
    )


def epoch_batcher(loader: DataLoader[Any]) -> EpochBatches:
    """The :class:`EpochBatches` of a loader built by :func:`training_loader`."""
    return cast(EpochBatches, loader.batch_sampler)


def micro_batch_size(loader: DataLoader[Any]) -> int | None:
    """The per-rank micro-batch size of a loader built by :func:`training_loader`, or
    ``None`` for the user's own batch sampler (whose order kiln cannot vouch for)."""
    if isinstance(loader.dataset, IterableDataset):
        return loader.batch_size
    batches = epoch_batcher(loader).batches
    if isinstance(batches, BatchSampler) and isinstance(batches.sampler, DistributedSampler):
        return batches.batch_size
    return None


def epoch_samples(dataset_size: int, batch_size: int, world_size: int, drop_last: bool) -> int:
    """Positions of the permutation one epoch trains on over all ranks: the sampler pads
    the epoch to a multiple of the world size, and with ``drop_last`` each rank drops its
    short last micro-batch. Two world sizes train the same epochs when this agrees."""
    per_rank = math.ceil(dataset_size / world_size)
    if drop_last:
        per_rank = per_rank // batch_size * batch_size
    return per_rank * world_size


def epoch_batches(
    fabric: Fabric, loader: DataLoader[Any], seed: int, epoch: int, skip: int = 0
) -> Iterator[Any]:
    """The batches of ``epoch`` (after its first ``skip``), on the host: the step moves each
    micro-batch to the device just before its forward, so memory does not grow with
    accumulation.

    Args:
        fabric: The run's Fabric.
        loader: A loader built by :func:`training_loader`.
        seed: The run's seed (worker seeds follow ``(seed, epoch)``).
        epoch: The epoch whose order to use.
        skip: Batches of the epoch already trained on; never loaded.
    """
    if isinstance(loader.dataset, IterableDataset):
        return iter(loader)  # a stream resumes from its loaded state, not by skipping
    epoch_batcher(loader).start(epoch, skip)
    generator = cast(torch.Generator | None, loader.generator)  # torch leaves it unannotated
    if generator is not None:
        generator.manual_seed(seed * 100_003 + epoch)
    return iter(loader)


def dataset_size(loader: DataLoader[Any]) -> int | None:
    """Number of samples in the loader's dataset, if it has a length."""
    inner: DataLoader[Any] = getattr(loader, "_dataloader", loader)
    try:
        return len(inner.dataset)  # pyright: ignore[reportArgumentType]  # TypeError if unsized
    except TypeError:
        return None


def gather_in_order(fabric: Fabric, tensor: torch.Tensor, size: int | None) -> torch.Tensor:
    """Gather per-sample ``tensor`` from every rank back into dataset order.

    A non-shuffling DistributedSampler deals index ``i`` to rank ``i % R``, padding the tail
    with repeats of the first indices so every rank has the same count. Interleaving the
    ranks' rows restores the order; cutting at the dataset size drops the repeats.
    """
    if fabric.world_size > 1:
        # (R, N, ...): a tensor in, a tensor out (Fabric annotates it for any collection)
        gathered = cast(torch.Tensor, fabric.all_gather(tensor))  # pyright: ignore[reportUnknownMemberType]
        tensor = gathered.transpose(0, 1).reshape(-1, *tensor.shape[1:])
    return tensor if size is None else tensor[:size]
