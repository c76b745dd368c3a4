"""Training progress on rank 0: a rich progress bar in a terminal, plain log lines elsewhere.

Plain lines (``step 10/100 loss 0.4213 samples/s 512.3 eta 0:01:05``) keep SLURM logs and
CI output readable, where a redrawn bar would be noise.
"""

from __future__ import annotations

import time
from datetime import timedelta
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress


def _format_eta(seconds: float | None) -> str:
    return "?" if seconds is None else str(timedelta(seconds=round(seconds)))


class Progress:
    """Shows how far training is, its loss, throughput and time left.

    Use as a context manager and call :meth:`update` after every optimizer step. In a
    terminal the bar moves every step; otherwise one line is printed per step that brings a
    loss (the loop's log steps) and at the last step.

    Args:
        total_steps: Optimizer steps the run will reach.
        enabled: Show anything at all (the loop passes ``False`` on ranks other than 0).
        start_step: The step a resumed run starts from.
        console: Where to draw; defaults to a rich ``Console`` on stdout, which is a
            terminal or not as detected (pass ``Console(force_terminal=...)`` to choose).
    """

    def __init__(
        self,
        total_steps: int,
        enabled: bool,
        start_step: int = 0,
        console: Console | None = None,
    ) -> None:
        if total_steps < 0 or not 0 <= start_step <= max(total_steps, 0):
            raise ValueError(
                f"total_steps={total_steps}, start_step={start_step} are not valid; "
                "need 0 <= start_step <= total_steps"
            )
        self.total_steps = total_steps
        self.start_step = start_step
        self.enabled = enabled
        self._console = console if console is not None else Console() if enabled else None
        self._bar: RichProgress | None = None
        self._task = None
        self._started: float | None = None
        self._loss: float | None = None
        self._samples_per_s: float | None = None

    @property
    def is_terminal(self) -> bool:
        return self._console is not None and self._console.is_terminal

    def __enter__(self) -> Progress:
        if not self.enabled:
            return self
        self._started = time.perf_counter()
        if self.is_terminal:
            self._bar = RichProgress(
                TextColumn("step"),
                MofNCompleteColumn(),
                BarColumn(),
                TextColumn("loss {task.fields[loss]}"),
                TextColumn("samples/s {task.fields[speed]}"),
                TextColumn("eta"),
                TimeRemainingColumn(),
                console=self._console,
            )
            self._task = self._bar.add_task(
                "train",
                total=self.total_steps,
                completed=self.start_step,
                loss="-",
                speed="-",
            )
            self._bar.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def _eta(self, step: int) -> float | None:
        done = step - self.start_step
        if self._started is None or done <= 0:
            return None
        elapsed = time.perf_counter() - self._started
        return elapsed / done * max(self.total_steps - step, 0)

    def update(self, step: int, loss: float | None, samples_per_s: float | None) -> None:
        """Report that optimizer step ``step`` is done.

        Args:
            step: The global step just completed.
            loss: The training loss, when this step computed it (log steps), else ``None``.
            samples_per_s: Current training throughput, or ``None`` if not known.
        """
        if not self.enabled:
            return
        if self._started is None:
            raise RuntimeError("Progress.update called outside its `with` block")
        if loss is not None:
            self._loss = loss
        if samples_per_s is not None:
            self._samples_per_s = samples_per_s
        loss_text = "-" if self._loss is None else f"{self._loss:.4f}"
        speed_text = "-" if self._samples_per_s is None else f"{self._samples_per_s:.1f}"
        if self._bar is not None and self._task is not None:  # both set together
            self._bar.update(self._task, completed=step, loss=loss_text, speed=speed_text)
            return
        if loss is None and step < self.total_steps:
            return
        line = (
            f"step {step}/{self.total_steps} loss {loss_text} samples/s {speed_text} "
            f"eta {_format_eta(self._eta(step))}"
        )
        assert self._console is not None  # enabled: it has one
        self._console.file.write(line + "\n")
        self._console.file.flush()
