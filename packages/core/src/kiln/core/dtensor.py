"""A tensor's part on this rank, whether or not it is sharded."""

from __future__ import annotations

import torch


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (FSDP2 parameters and gradients); any other tensor as is."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
