"""Each rank's random streams in a checkpoint: python ``random``, numpy, torch CPU and CUDA.

Stored as tensors and plain values, so a checkpoint's ``meta.pt`` loads with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import random
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist

# numpy's legacy state of its global MT19937 generator (never the dict form there)
_NumpyState = tuple[str, np.ndarray[Any, np.dtype[np.uint32]], int, int, float]


def capture_rng_state() -> dict[str, Any]:
    """This process's RNG states: python ``random``, numpy, torch CPU and every CUDA device.

    The numpy state is stored as a tensor and plain values so the checkpoint stays loadable
    with ``weights_only=True``.
    """
    name, keys, pos, has_gauss, cached_gaussian = cast(
        _NumpyState, np.random.get_state(legacy=True)
    )
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "name": name,
            "keys": torch.as_tensor(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore the RNG states captured by :func:`capture_rng_state`.

    CUDA states are restored for the devices both the checkpoint and this machine have.
    """
    for key in ("python", "numpy", "torch"):
        if key not in state:
            raise ValueError(
                f"RNG state is missing {key!r} (has {sorted(state)}); "
                "expected the dict returned by capture_rng_state()"
            )
    version, internal, gauss_next = state["python"]
    # weights_only loading may turn the inner tuple into a list; random.setstate wants a tuple
    random.setstate((version, tuple(internal), gauss_next))
    np_state = state["numpy"]
    np.random.set_state(
        (
            np_state["name"],
            np_state["keys"].numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        for device, cuda_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, device)


def gather_rng_states() -> list[dict[str, Any]]:
    """Every rank's RNG state, indexed by global rank (a single entry without a process group)."""
    local = capture_rng_state()
    if not (dist.is_available() and dist.is_initialized()):
        return [local]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    return gathered


class RngStreams:
    """Every rank's random streams as one checkpoint entry (``"rng"``, a list by global
    rank). On load, this rank's stream waits in :attr:`loaded` for the loop to restore it
    once the epoch's iterator stands where the checkpointed run stood; ``None`` when the
    checkpoint came from another number of ranks (each stream belongs to the world that
    saved it)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.loaded: dict[str, Any] | None = None

    def state_dict(self) -> list[dict[str, Any]]:
        return gather_rng_states()  # a collective: every rank saves

    def load_state_dict(self, states: list[dict[str, Any]]) -> None:
        self.loaded = states[self.rank] if len(states) == self.world_size else None

    def load_missing(self, path: Any) -> None:
        """An entry-less checkpoint: each rank starts a fresh stream (``resume``)."""
        self.loaded = None
