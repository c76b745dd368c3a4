"""How ``fit`` calls hooks: the per-step ``fabric.call`` that skips hooks nobody defines
(:class:`StepHooks`), and the stateful callbacks saved as one checkpoint entry
(:class:`CallbackStates`; the rules are in ``kiln.core.callbacks``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning as L


def state_key(callback: Any) -> str:
    """Where ``callback``'s state lives in a checkpoint's ``"callbacks"`` entry."""
    return str(getattr(callback, "state_key", type(callback).__name__))


def is_stateful(callback: Any) -> bool:
    return callable(getattr(callback, "state_dict", None)) and callable(
        getattr(callback, "load_state_dict", None)
    )


class CallbackStates:
    """The stateful callbacks of a run, saved and loaded as one checkpoint entry.

    Args:
        callbacks: The objects passed to ``fit(callbacks=...)``.

    Raises:
        ValueError: Two stateful callbacks share a state key.
    """

    def __init__(self, callbacks: Sequence[Any]) -> None:
        self.stateful: dict[str, Any] = {}
        for callback in callbacks:
            if not is_stateful(callback):
                continue
            key = state_key(callback)
            if key in self.stateful:
                raise ValueError(
                    f"two callbacks save their state under {key!r}; give one of them a "
                    "distinct `state_key` attribute"
                )
            self.stateful[key] = callback

    def __bool__(self) -> bool:
        return bool(self.stateful)

    def state_dict(self) -> dict[str, Any]:
        return {key: callback.state_dict() for key, callback in self.stateful.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = [key for key in self.stateful if key not in state]
        if missing:
            raise KeyError(
                f"the checkpoint holds no state for callbacks {missing} (it has "
                f"{sorted(state)}); was it saved by a run without them?"
            )
        for key, callback in self.stateful.items():
            callback.load_state_dict(state[key])


class StepHooks:
    """``fabric.call`` for the per-step hooks, skipped for a hook that nobody defines.

    ``fabric.call`` inspects each listener's signature on every call (tens of microseconds),
    and LightningModule defines every hook as a no-op; once per micro-batch that adds up.

    Args:
        fabric: The run's Fabric.
        listeners: What Fabric calls: the module, then the callbacks.
    """

    def __init__(self, fabric: Any, listeners: Sequence[Any]) -> None:
        self._fabric, self._listeners = fabric, list(listeners)
        self._listened: dict[str, bool] = {}

    def __call__(self, hook: str, *args: Any) -> None:
        listened = self._listened.get(hook)
        if listened is None:
            listened = self._listened[hook] = any(_defines(x, hook) for x in self._listeners)
        if listened:
            self._fabric.call(hook, *args)


def _defines(listener: Any, hook: str) -> bool:
    """Whether ``listener`` has ``hook`` other than LightningModule's no-op."""
    method = getattr(listener, hook, None)
    if not callable(method):
        return False
    default = getattr(L.LightningModule, hook, None)
    return default is None or getattr(method, "__func__", None) is not default
