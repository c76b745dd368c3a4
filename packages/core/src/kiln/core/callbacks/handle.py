"""What a callback sees of a running ``fit``: :class:`FitHandle`, given to
``on_loop_start(fit)`` (the points a callback may define are in ``callback_points.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kiln.core.state import Context, RunState


class FitHandle:
    """A callback's handle on the running ``fit``, given to ``on_loop_start(fit)``.

    Attributes:
        fabric: The run's Fabric.
        module: The LightningModule as given to ``fit`` (its parameters are the ones trained).
        model: The Fabric-wrapped (maybe compiled) module that runs the steps.
        optimizer: The Fabric-wrapped optimizer.
        trainer: The run's ``TrainerConfig`` (read it; do not change it).
    """

    def __init__(
        self,
        ctx: Context,
        run: RunState,
        save: Callable[[Path], Path],
        save_at_step_end: Callable[[Path], None],
    ) -> None:
        self._ctx, self._run, self._save = ctx, run, save
        self._save_at_step_end = save_at_step_end
        self.fabric, self.module, self.model = ctx.fabric, ctx.module, ctx.model
        self.optimizer, self.trainer = ctx.optimizer, ctx.trainer

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far."""
        return self._run.global_step

    @property
    def metrics(self) -> dict[str, float]:
        """The latest validation metrics (``val/<name>``); empty before the first."""
        return dict(self._run.metrics)

    @property
    def validates(self) -> bool:
        """Whether the run validates at all (a val loader and ``validation_step``)."""
        module = self._ctx.module
        return self._ctx.val_loader is not None and callable(
            getattr(module, "validation_step", None)
        )

    @property
    def stop_reason(self) -> str | None:
        """Why the run was asked to stop, or ``None`` while it goes on."""
        return self._run.stop_reason

    def request_stop(self, reason: str) -> None:
        """Stop the run at the end of the current step, as if it had reached ``max_steps``.

        The loop checks the request at the step boundary, without a collective: request it
        on every rank alike (e.g. from validation metrics, which every rank shares). That
        step is then logged, validated and checkpointed like a last step, and
        ``FitResult.stop_reason`` is ``reason``. The first request wins.
        """
        if self._run.stop_reason is None:
            self._run.stop_reason = reason

    def save_checkpoint(self, path: str | Path) -> Path:
        """Save the whole run, as the loop's own checkpoints do, atomically to ``path``.

        Collective: call it on every rank. The file is not one of the ``step-*.ckpt`` the
        loop prunes or resumes from, so ``path`` must not be named like one.
        """
        return self._save(Path(path))

    def save_checkpoint_at_step_end(self, path: str | Path) -> None:
        """Save the whole run to ``path`` once the current step is done, as its own
        ``step-<N>.ckpt`` holds it: after every callback has seen this validation's metrics
        (their states, a stop one of them requested) and after the step's log row.

        Collective: request it on every rank alike (e.g. from validation metrics). The same
        naming rule as :meth:`save_checkpoint` applies; a path asked for twice in one step is
        saved once.
        """
        self._save_at_step_end(Path(path))
