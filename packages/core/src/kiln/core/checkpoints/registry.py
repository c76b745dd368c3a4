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

__all__ = [
    "ALLOW_SWITCH",
    "CheckpointState",
    "Record",
    "StateChangedError",
    "Stateful",
    "by_entry",
    "state_refusal",
    "unclaimed",
]

ALLOW_SWITCH = "trainer.allow_changed_state=true"
"""How a resume says it means to go on with state the checkpoint and the run do not share."""

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


class StateChangedError(ValueError):
    """A resume would drop state the checkpoint holds that no part of this run takes (a
    callback's, with no callback to take it), or start fresh a callback's state the
    checkpoint lacks; the message names each key and the opt-out (:data:`ALLOW_SWITCH`)."""


def unclaimed(remainder: dict[str, Any]) -> list[str]:
    """The keys of ``remainder`` (what a loaded checkpoint held that no registered object
    took), a ``"callbacks"`` entry as each callback's ``callbacks/<key>``."""
    keys: list[str] = []
    for key, value in remainder.items():
        if key == "callbacks" and isinstance(value, dict) and value:
            keys.extend(f"callbacks/{k}" for k in value)  # pyright: ignore[reportUnknownVariableType]
        else:
            keys.append(key)
    return sorted(keys)


def state_refusal(path: Any, dropped: list[str], fresh: list[str]) -> str:
    """The one-line refusal of a resume whose state differs from the checkpoint's: what
    would be dropped, what would start fresh, and the ways on."""
    parts: list[str] = []
    if dropped:
        parts.append(
            f"holds state that no part of this run takes: {', '.join(dropped)} (resuming "
            "would drop it from every later checkpoint)"
        )
    if fresh:
        parts.append(
            f"holds no state for {', '.join(fresh)} (its run had no such callback, or dropped "
            "its state; it would start fresh here)"
        )
    return (
        f"checkpoint {path} {'; and it '.join(parts)}: resume with the same stateful "
        f"callbacks as the run that wrote it, or go on deliberately with {ALLOW_SWITCH} "
        "(TrainerConfig(allow_changed_state=True))"
    )


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
