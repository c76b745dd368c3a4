"""Data plumbing the loop owns: a training order that depends only on (seed, epoch), and
validation outputs gathered across ranks in dataset order."""

from __future__ import annotations

import warnings

import torch
from lightning.fabric import Fabric
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler


def training_loader(loader: DataLoader, fabric: Fabric, seed: int) -> DataLoader:
    """Rebuild ``loader`` with a seeded sampler and set it up with Fabric.

    The order of epoch ``e`` is a function of ``(seed, e)`` alone, and iterator creation
    draws no global random numbers, so a run resumed mid-epoch sees exactly the batches
    an uninterrupted run sees.
    """
    if isinstance(loader.dataset, IterableDataset):
        raise TypeError("kiln's loop needs a map-style training dataset, got an IterableDataset")
    if loader.batch_size is None:
        # A custom batch sampler (e.g. length buckets) keeps its own order; Fabric still
        # shards it across ranks. Resume is exact only if it seeds itself by epoch.
        warnings.warn(
            "train_dataloader() uses a custom batch_sampler: kiln keeps it, and mid-epoch "
            "resume is exact only if it orders batches by (seed, epoch) via set_epoch()",
            stacklevel=2,
        )
        return fabric.setup_dataloaders(loader, move_to_device=False)  # see below
    sampler = DistributedSampler(
        loader.dataset,
        num_replicas=fabric.world_size,
        rank=fabric.global_rank,
        shuffle=isinstance(loader.sampler, RandomSampler),
        seed=seed,
    )
    rebuilt = DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        sampler=sampler,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        prefetch_factor=loader.prefetch_factor,
        persistent_workers=False,
        # Worker seeds come from this generator, reseeded every epoch (see set_epoch).
        generator=torch.Generator(),
    )
    # Batches stay on the host: the step counts a window's items there and moves one
    # micro-batch at a time to the device, so memory does not grow with accumulation.
    return fabric.setup_dataloaders(rebuilt, use_distributed_sampler=False, move_to_device=False)


def set_epoch(loader: DataLoader, seed: int, epoch: int) -> None:
    """Point the loader's sampler and worker seeds at ``epoch``."""
    inner = getattr(loader, "_dataloader", loader)  # unwrap Fabric's wrapper
    for sampler in (
        inner.sampler,
        inner.batch_sampler,
        getattr(inner.batch_sampler, "sampler", None),
    ):
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
    if inner.generator is not None:
        inner.generator.manual_seed(seed * 100_003 + epoch)


def dataset_size(loader: DataLoader) -> int | None:
    """Number of samples in the loader's dataset, if it has a length."""
    inner = getattr(loader, "_dataloader", loader)
    try:
        return len(inner.dataset)
    except TypeError:
        return None


def gather_in_order(fabric: Fabric, tensor: torch.Tensor, size: int | None) -> torch.Tensor:
    """Gather per-sample ``tensor`` from every rank back into dataset order.

    A non-shuffling DistributedSampler deals index ``i`` to rank ``i % R``, padding the tail
    with repeats of the first indices so every rank has the same count. Interleaving the
    ranks' rows restores the order; cutting at the dataset size drops the repeats.
    """
    if fabric.world_size > 1:
        gathered = fabric.all_gather(tensor)  # (R, N, ...)
        tensor = gathered.transpose(0, 1).reshape(-1, *tensor.shape[1:])
    return tensor if size is None else tensor[:size]
