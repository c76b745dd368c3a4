"""What a checkpoint holds: every piece of state, registered once by the code that owns it.

As in torchtitan, each piece is a ``Stateful`` (``state_dict()`` / ``load_state_dict()``,
``torch.distributed.checkpoint.stateful.Stateful``) under a key; saving and resuming iterate
the registry and no code lists the keys. ``fit`` registers the model, optimizer, scheduler,
grad scaler and callbacks; the loop its counters (``"loop"``) and random streams
(``"rng"``); the resume stage the world the run trains on (``"world"``); a stream its
position (``"train_stream"``); the module what it trains on (its ``checkpoint_state()``).
The model and optimizers go to torch distributed checkpoint (resharded on load); every other
entry's ``state_dict()`` goes to ``meta.pt``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.distributed.checkpoint.stateful import Stateful

__all__ = ["CheckpointState", "Record", "Stateful", "by_entry"]

# a checkpoint of 05087a5 or earlier keeps these at its top level
_LOOP_KEYS = (
    "global_step",
    "epoch",
    "batch_in_epoch",
    "skipped_steps",
    "history",
    "validation_history",
    "metrics",
    "stop_reason",
    "run_id",
)
_WORLD_KEYS = ("world_size", "accumulate_grad_batches", "micro_batch_size", "threads_per_rank")


class CheckpointState:
    """The registry: key -> ``Stateful`` (or the Fabric-wrapped model and optimizers)."""

    def __init__(self) -> None:
        self._entries: dict[str, Any] = {}

    def register(self, key: str, obj: Any) -> None:
        """Save ``obj``'s state under ``key`` in every checkpoint and restore it on resume.

        Raises:
            ValueError: ``key`` is taken, or ``obj`` has no ``state_dict``/``load_state_dict``.
        """
        if key in self._entries:
            raise ValueError(f"checkpoint state {key!r} is registered twice")
        if not all(callable(getattr(obj, m, None)) for m in ("state_dict", "load_state_dict")):
            raise ValueError(
                f"checkpoint state {key!r}: {type(obj).__name__} has no state_dict() and "
                "load_state_dict(); wrap a plain value in checkpoints.registry.Record"
            )
        self._entries[key] = obj

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __getitem__(self, key: str) -> Any:
        return self._entries[key]

    def objects(self) -> dict[str, Any]:
        """Key -> registered object, for ``save_checkpoint`` and ``load_checkpoint``."""
        return dict(self._entries)


class Record:
    """A value every checkpoint records and a resume leaves as this run has it (the run's
    config: a resumed run may have changed ``max_steps``); read a checkpoint's with
    ``read_checkpoint_meta``."""

    def __init__(self, value: Any = None) -> None:
        self.value = value

    def state_dict(self) -> Any:
        return self.value

    def load_state_dict(self, state: Any) -> None:
        """The saved value is the checkpointed run's, not this one's: nothing to restore."""

    def load_missing(self, path: Any) -> None:
        """Nothing to restore either."""


def by_entry(saved: dict[str, Any]) -> dict[str, Any]:
    """``saved`` keyed by registry entry: a checkpoint written before the registry keeps the
    loop's counters and its world at the top level; they move under ``"loop"`` and
    ``"world"``, where the registered objects read them."""
    if "loop" in saved or "global_step" not in saved:
        return saved
    saved["loop"] = {k: saved.pop(k) for k in _LOOP_KEYS if k in saved}
    saved["world"] = {k: saved.pop(k) for k in _WORLD_KEYS if k in saved}
    return saved
