"""Seeds: one seed decides the starting weights, each rank then draws its own stream.

``trainer.seed`` seeds every process before the model is built (callers do that, so jobs
that differ only in precision or compile mode start from the same weights) and again at
the start of ``fit``. Once the model is set up (DDP has broadcast rank 0's parameters and
buffers), each rank reseeds with ``rank_seed(seed, rank) = seed + rank`` (nanoGPT's seed
offset), so dropout and augmentation differ across ranks. Checkpoints store every rank's
RNG state, and a resumed rank restores its own.
"""

from __future__ import annotations

import hashlib
import random
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12


def rank_seed(seed: int, rank: int) -> int:
    """The seed of ``rank``'s random stream after initialization: ``seed + rank``."""
    if rank < 0:
        raise ValueError(f"rank={rank} is not valid; a rank is >= 0")
    return seed + rank


def seed_rank_streams(seed: int, rank: int) -> None:
    """Seed python, numpy and torch (CPU and every CUDA device) with ``rank_seed``."""
    value = rank_seed(seed, rank)
    random.seed(value)
    np.random.seed(value % 2**32)  # numpy takes 32-bit seeds
    torch.manual_seed(value)  # pyright: ignore[reportUnknownMemberType]  # seed unannotated


def weights_hash(module: torch.nn.Module) -> str:
    """SHA-256 over a module's state dict (keys in order, each tensor's dtype, shape, bytes).

    Cheap enough to log once per run: equal hashes mean bit-identical weights, so jobs of
    a sweep can show they started from the same model. ``torch.compile``'s ``_orig_mod.``
    prefix is dropped from keys, so an eager and a compiled copy hash alike.
    """
    digest = hashlib.sha256()
    for key, value in module.state_dict().items():
        digest.update(key.replace("_orig_mod.", "").encode())
        if isinstance(value, torch.Tensor):
            tensor = value.detach().cpu().contiguous()
            digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
            # reshape: a 0-dim tensor (BatchNorm's num_batches_tracked) cannot be viewed as bytes
            flat = tensor.reshape(-1)
            # the tensor's own memory, no copy (numpy arrays are buffers)
            digest.update(cast("Buffer", flat.view(torch.uint8).numpy()) if tensor.numel() else b"")
        else:
            digest.update(repr(value).encode())
    return digest.hexdigest()
