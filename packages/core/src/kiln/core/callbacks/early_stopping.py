"""Stop the run when a validation metric has stopped improving."""

from __future__ import annotations

from typing import Any

from kiln.core.callbacks.monitor import check_mode, improves, monitored, require_validation


class EarlyStopping:
    """Stop after ``patience`` validations in a row without improvement of ``monitor``.

    The stop is requested at the validation and honoured at the end of that step, which
    then finishes like the last step (logged, checkpointed); ``FitResult.stop_reason``
    starts with ``"EarlyStopping"``. The first validation sets the best value; a
    non-finite value never improves on it. Resumable: the best value and the count of
    validations without improvement are saved in checkpoints.

    Args:
        monitor: The validation metric to watch, as logged (``val/<name>``).
        mode: ``"min"`` if lower is better, ``"max"`` if higher is better.
        patience: Validations without improvement after which the run stops (>= 1).
        min_delta: How much better than the best a value must be to count as improvement.
    """

    def __init__(
        self,
        monitor: str = "val/loss",
        mode: str = "min",
        patience: int = 3,
        min_delta: float = 0.0,
    ) -> None:
        check_mode("EarlyStopping", mode)
        if patience < 1:
            raise ValueError(f"EarlyStopping: patience={patience} is not valid; use >= 1")
        if min_delta < 0:
            raise ValueError(f"EarlyStopping: min_delta={min_delta} is not valid; use >= 0")
        self.monitor, self.mode, self.patience, self.min_delta = monitor, mode, patience, min_delta
        self.best: float | None = None
        self.best_step: int | None = None
        self.wait = 0  # validations since the best one
        self._fit: Any = None

    def __repr__(self) -> str:
        return f"EarlyStopping(monitor={self.monitor!r}, mode={self.mode!r})"

    def on_loop_start(self, fit: Any) -> None:
        require_validation(repr(self), fit)
        self._fit = fit

    def on_validation_metrics(self, metrics: dict[str, float]) -> None:
        value = monitored(repr(self), self.monitor, metrics)
        if improves(value, self.best, self.mode, self.min_delta):
            self.best, self.best_step, self.wait = value, self._fit.global_step, 0
            return
        self.wait += 1
        if self.wait >= self.patience:
            self._fit.request_stop(
                f"EarlyStopping: {self.monitor} did not improve on {self.best} (step "
                f"{self.best_step}) by more than {self.min_delta} in {self.wait} validations"
            )

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_step": self.best_step, "wait": self.wait}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_step, self.wait = state["best"], state["best_step"], state["wait"]
