"""What a checkpoint directory holds, read back in one process, and ways to damage one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save


def saved_state(path: Path, scratch: Path) -> dict[str, Any]:
    """Everything a checkpoint saved, as one plain dict: its DCP part (model and optimizer
    state, by parameter name) with its ``meta.pt``."""
    whole = scratch / f"{path.name}.whole.pt"
    dcp_to_torch_save(path, whole)
    state = torch.load(whole, weights_only=False)
    meta = torch.load(path / "meta.pt", weights_only=True)
    # the loop's counters and its world, by entry, read as the plain values they are
    state.update({**meta, **meta.get("loop", {}), **meta.get("world", {})})
    return state


def shard_file(path: Path) -> Path:
    """A checkpoint's largest tensor data file."""
    return max(path.glob("*.distcp"), key=lambda p: p.stat().st_size)


def flip_a_byte(path: Path) -> Path:
    """Flip one byte in the middle of the checkpoint's largest data file (it stays readable)."""
    shard = shard_file(path)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    return shard


def truncate(path: Path) -> Path:
    """Cut the checkpoint's largest data file in half."""
    shard = shard_file(path)
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    return shard
