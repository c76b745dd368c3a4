"""Keep the checkpoint of the best validation metric beside the loop's last K."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.core.callbacks.monitor import check_mode, improves, monitored, require_validation


class BestCheckpoint:
    """Save the run to ``<dirpath>/<filename>`` whenever ``monitor`` reaches a new best.

    The file is a whole checkpoint, written atomically by the loop's own writer (the same
    content as ``step-<N>.ckpt`` of that step); the loop never prunes it and
    ``resume="auto"`` never picks it. Resumable: the best value and its step are saved in
    checkpoints, so a resumed run only replaces the file with a better one.

    Args:
        monitor: The validation metric to watch, as logged (``val/<name>``).
        mode: ``"max"`` if higher is better, ``"min"`` if lower is better.
        dirpath: Where to save; ``None``: ``trainer.checkpoint_dir``.
        filename: The file's name (not named like ``step-<N>.ckpt``).

    Attributes:
        best: The best value so far (``None`` before the first validation).
        best_step: The step it was measured at.
        path: The best checkpoint's path (set when the run starts).
    """

    def __init__(
        self,
        monitor: str = "val/accuracy",
        mode: str = "max",
        dirpath: str | Path | None = None,
        filename: str = "best.ckpt",
    ) -> None:
        check_mode("BestCheckpoint", mode)
        self.monitor, self.mode, self.dirpath, self.filename = monitor, mode, dirpath, filename
        self.best: float | None = None
        self.best_step: int | None = None
        self.path: Path | None = None
        self._fit: Any = None

    def __repr__(self) -> str:
        return f"BestCheckpoint(monitor={self.monitor!r}, mode={self.mode!r})"

    def on_loop_start(self, fit: Any) -> None:
        require_validation(repr(self), fit)
        directory = self.dirpath if self.dirpath is not None else fit.trainer.checkpoint_dir
        if directory is None:
            raise ValueError(f"{self!r} needs a directory: pass dirpath= or set checkpoint_dir")
        self.path, self._fit = Path(directory) / self.filename, fit

    def on_validation_metrics(self, metrics: dict[str, float]) -> None:
        value = monitored(repr(self), self.monitor, metrics)
        if improves(value, self.best, self.mode):
            # recorded now, so the saved file knows it is the best one; saved at the step's
            # end, once the callbacks after this one have seen the metrics too
            self.best, self.best_step = value, self._fit.global_step
            self._fit.save_checkpoint_at_step_end(self.path)

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_step": self.best_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_step = state["best"], state["best_step"]
