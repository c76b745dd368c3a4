"""The named points where code that is not the step's math hooks into ``fit``.

Every callback is a plain object passed to ``fit(callbacks=[...])``; kiln's own observers
(step timing, padding, the compile watch, the machine sampler, the progress bar, the stop
poll, the first step's checks) use the same points. A callback defines the ``on_*`` methods
it needs; :class:`Callback` lists them all as no-ops, to subclass or to read.

The points of one optimizer step, in order::

    on_window_start(window)                 # the window's host micro-batches, before the step
      for each micro-batch:
        on_before_backward(loss)            # Lightning's hooks, on the module too
        on_after_backward()
        on_train_batch_end(outputs, batch, batch_idx)   # the last one after the update
      on_window_end(window, num_items, total)  # after the backwards, before clipping
      on_before_optimizer_step(optimizer)
    on_step_end(step)                       # after the update; the step's time stops first
    on_log(step, metrics)                   # a log row: add entries to ``metrics`` for the
                                            # loggers (the run's history keeps the row)
    on_validation_metrics(metrics)          # after each validation

Around the loop: ``on_loop_start(fit)`` (a :class:`~kiln.core.callbacks.handle.FitHandle`),
Lightning's ``on_fit_start``/``on_fit_end``, ``on_train_epoch_start``/``_end``,
``on_validation_start``/``_end``, and ``on_exception(error)``. ``on_fit_telemetry(telemetry)``
runs once at the end: add figures to the run's telemetry dict.

A callback with ``state_dict()`` and ``load_state_dict(state)`` is saved in every checkpoint
under ``"callbacks"`` and its ``state_key`` (else its class name), and restored on resume.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import lightning as L


class Callback:
    """Every point a callback may define, as a no-op (see the module doc for the order)."""

    def on_loop_start(self, fit: Any) -> None:
        """Once, after setup and resume: ``fit`` is the callback's handle on the run."""

    def on_window_start(self, window: list[Any]) -> None:
        """Before a step, with its window of host micro-batches."""

    def on_window_end(self, window: list[Any], num_items: list[Any], total: Any) -> None:
        """After the window's backwards, before clipping: ``num_items`` of each micro-batch
        (this rank's), ``total`` the window's items over all ranks."""

    def on_step_end(self, step: int) -> None:
        """After the optimizer step ``step`` (the step's time is already taken)."""

    def on_log(self, step: int, metrics: dict[str, Any]) -> None:
        """Before a log row goes to the loggers: add entries to ``metrics`` to log them too."""

    def on_validation_metrics(self, metrics: dict[str, float]) -> None:
        """After each validation, with its ``val/`` metrics (the same on every rank)."""

    def on_fit_telemetry(self, telemetry: dict[str, Any]) -> None:
        """At the end of ``fit``: add this callback's figures to the run's telemetry."""

    def on_exception(self, error: BaseException) -> None:
        """An error (Ctrl-C included) leaves the loop: end what the callback started."""


class CallbackList:
    """Calls a point on every listener that defines it: the module first, then callbacks.

    Each point is resolved once into the bound methods that define it (LightningModule
    defines every Lightning hook as a no-op, and Fabric's ``call`` inspects each listener's
    signature on every call, tens of microseconds a step), then called in order.

    Args:
        listeners: The module, then the callbacks, in calling order.
    """

    def __init__(self, listeners: Sequence[Any]) -> None:
        self.listeners = list(listeners)
        self._resolved: dict[str, list[Callable[..., Any]]] = {}

    def __call__(self, point: str, *args: Any) -> None:
        methods = self._resolved.get(point)
        if methods is None:
            methods = self._resolved[point] = [
                getattr(x, point) for x in self.listeners if _defines(x, point)
            ]
        for method in methods:
            method(*args)

    def remove(self, listener: Any) -> None:
        """Stop calling ``listener`` (e.g. the first step's checks, once done)."""
        self.listeners.remove(listener)
        self._resolved.clear()


def _defines(listener: Any, point: str) -> bool:
    """Whether ``listener`` has ``point`` other than LightningModule's or Callback's no-op."""
    method = getattr(listener, point, None)
    if not callable(method):
        return False
    own = getattr(method, "__func__", None)
    return all(own is not getattr(base, point, None) for base in (L.LightningModule, Callback))


def state_key(callback: Any) -> str:
    """Where ``callback``'s state lives in a checkpoint's ``"callbacks"`` entry."""
    return str(getattr(callback, "state_key", type(callback).__name__))


def is_stateful(callback: Any) -> bool:
    return callable(getattr(callback, "state_dict", None)) and callable(
        getattr(callback, "load_state_dict", None)
    )


class CallbackStates:
    """The stateful callbacks of a run, one checkpoint entry (``"callbacks"``).

    On load, what does not match stays to be judged by the resume (``loop/resume.py``),
    which refuses it unless told to go on: :attr:`dropped` holds the checkpoint's
    ``callbacks/<key>`` no callback of this run takes, :attr:`fresh` this run's callbacks
    the checkpoint holds no state for (they keep the state they were built with).

    Args:
        callbacks: The objects passed to ``fit(callbacks=...)``.

    Raises:
        ValueError: Two stateful callbacks share a state key.
    """

    def __init__(self, callbacks: Sequence[Any]) -> None:
        self.stateful: dict[str, Any] = {}
        self.dropped: list[str] = []
        self.fresh: list[str] = []
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
        self.dropped = [f"callbacks/{key}" for key in state if key not in self.stateful]
        self.fresh = [f"callbacks/{key}" for key in self.stateful if key not in state]
        for key, callback in self.stateful.items():
            if key in state:
                callback.load_state_dict(state[key])

    def load_missing(self, path: Any) -> None:
        """A checkpoint without the entry (its run had no stateful callback)."""
        self.load_state_dict({})
