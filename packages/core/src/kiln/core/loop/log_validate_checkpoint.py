"""What happens after each optimizer step, on its own period: log the training loss,
validate, checkpoint.

Step losses stay on the device until a log step or a checkpoint, where they are brought to
the host together (one sync point) and checked: a non-finite loss stops the run before it
can reach a checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any, cast

import torch

from kiln.core.checkpoints.save import CheckpointWrites, save_checkpoint
from kiln.core.distributed.stop import stop_if_agent_died
from kiln.core.errors import NonFiniteLossError, check_finite_weights
from kiln.core.loop.step import (
    StepOutput,
    all_reduce_sum,
    as_count_tensor,
    check_window_total,
    window_loss_sums,
)
from kiln.core.loop.validation import validate
from kiln.core.state import Context, RunState

log = logging.getLogger(__name__)


class LogValidateCheckpoint:
    """Logging, validation and checkpoints after each step of a run, each on its period (see
    the module doc).

    Args:
        ctx: What ``setup`` built.
        run: Where the run stands.
    """

    def __init__(self, ctx: Context, run: RunState) -> None:
        self.ctx, self.run = ctx, run
        self._pending: list[StepOutput] = []  # steps whose losses the host has not read
        self._at_step_end: list[Path] = []  # checkpoints callbacks asked for at the step's end
        # periodic checkpoints written while training goes on (trainer.async_checkpoint)
        self.writes = CheckpointWrites()
        wanted = ctx.trainer.async_checkpoint
        self._async = ctx.fabric.device.type == "cuda" if wanted is None else wanted
        self._committing: Path | None = None  # the periodic checkpoint being written

    def after_step(self, out: StepOutput, interrupted: Callable[[], bool] = lambda: False) -> None:
        """Log, validate and checkpoint as ``trainer`` says; all three at the last step.

        ``interrupted``: whether a signal stops the run after this step (asked after the
        validation, which a signal to one process ends early); it is checkpointed, and
        logged and validated only where its cadence says (a resumed run logs the rest).
        """
        trainer, run = self.ctx.trainer, self.run
        self._pending.append(out)
        # a stop requested by a callback makes this the last step
        done = run.global_step >= self.ctx.total_steps or run.stop_reason is not None
        logged = done or _every(run.global_step, trainer.log_every_n_steps)
        if logged:
            self.log(out.grad_norm)
        if done or _every(run.global_step, trainer.val_every_n_steps):
            self.validate()
        if run.stop_reason is not None and not done:  # stopped at this validation
            done = True
            if not logged:
                self.log(out.grad_norm)
        if trainer.checkpoint_dir is not None and (
            done or interrupted() or _every(run.global_step, trainer.checkpoint_every_n_steps)
        ):
            self.checkpoint()
        requested, self._at_step_end = self._at_step_end, []
        for path in requested:  # the step is done: they hold what its checkpoint holds
            self.checkpoint(path)

    def checkpoint_at_step_end(self, path: Path) -> None:
        """Save the run to ``path`` at the end of the current step (``after_step``)."""
        if path not in self._at_step_end:
            self._at_step_end.append(path)

    def validate(self) -> None:
        """Validate; hand the metrics to ``on_validation_metrics`` (EMA weights are back)."""
        metrics = validate(self.ctx, self.run.global_step)
        if metrics is not None:
            self.run.metrics = metrics
            # in the checkpoints: a resumed run re-logs what a killed one's logger lost
            self.run.validation_history.append({"step": self.run.global_step, **metrics})
            self.ctx.callbacks("on_validation_metrics", metrics)

    def log(self, grad_norm: torch.Tensor | None) -> None:
        """Log the latest step's loss, learning rate and grad norm (``on_log`` first: a
        callback may add entries for the loggers; the run's history keeps the row)."""
        ctx, run = self.ctx, self.run
        step, loss = self.flush()[-1]
        row: dict[str, Any] = {
            "step": step,
            "train/loss": loss,
            "train/lr": run.lr,  # the rate this step used, not the one the scheduler set next
            "train/skipped_steps": run.skipped_steps,
        }
        if grad_norm is not None:
            row["train/grad_norm"] = float(grad_norm)
        run.history.append(row)
        logged = {k: v for k, v in row.items() if k != "step"}
        ctx.callbacks("on_log", step, logged)
        try:
            ctx.fabric.log_dict(logged, step=step)
        except Exception as error:
            if not stop_if_agent_died():
                raise
            # stopping (a killed launch agent took the W&B service with it): the checkpoint
            # must still be written; it keeps this row, and the resumed run logs it
            log.warning("logging step %d failed while stopping: %r", step, error)

    def checkpoint(self, path: Path | None = None) -> Path:
        """Save the run where it stands (after checking the losses since the last sync and
        the weights themselves).

        Args:
            path: Save there (e.g. ``best.ckpt``) instead of as the step's checkpoint in
                ``trainer.checkpoint_dir``; such a file is not the run's newest checkpoint.
        """
        ctx, run = self.ctx, self.run
        self.wait_for_checkpoints()  # one save at a time
        self.flush()  # never save weights after a non-finite loss
        # the loss is computed before the update: only the weights show an overflowed step
        check_finite_weights(ctx.fabric, ctx.model, run.global_step)
        directory = ctx.trainer.checkpoint_dir if path is None else path.parent
        if directory is None:
            raise ValueError(
                "no checkpoint to save: trainer.checkpoint_dir is None and no path given"
            )
        if path is not None:  # run.json has one writer at a time: the pending write ends first
            self.wait_for_checkpoints()
        saved = save_checkpoint(
            ctx.fabric,
            directory,
            run.global_step,
            ctx.state.objects(),  # every registered piece (kiln.core.checkpoints.registry)
            keep_last_k=ctx.trainer.keep_last_k,
            name=None if path is None else path.name,
            run_id=run.run_id,
            # a callback's own path is in place when it returns: the callback may read it
            writes=self.writes if path is None and self._async else None,
        )
        if path is None:
            self._committing = saved
        return saved

    def wait_for_checkpoints(self) -> None:
        """Wait until the periodic checkpoint being written is in place (every rank; a
        failed write raises ``CheckpointWriteError`` on all); it is then the run's newest."""
        self.writes.wait(self.ctx.fabric)
        self._committed()

    @contextlib.contextmanager
    def closed_on_error(self) -> Generator[None]:
        """Around the loop: on an error leaving it, the checkpoint being written still ends
        (this process only: no collective), so what was saved before the error stays saved."""
        try:
            yield
        except BaseException:
            if self.writes.close():
                self._committed()
            raise

    def _committed(self) -> None:
        if self._committing is not None:
            self.run.checkpoint, self._committing = str(self._committing), None

    def flush(self) -> list[tuple[int, float]]:
        """Bring pending step losses to the host (a sync point); stop on a non-finite one.

        Returns:
            ``(step, mean loss over the window and all ranks)`` of each pending step.
        """
        if not self._pending:
            return []
        fabric = self.ctx.fabric
        pending, self._pending = self._pending, []
        sums = window_loss_sums(pending, fabric.device)
        if fabric.world_size > 1:
            sums = all_reduce_sum(fabric, sums)
        counts = [p.total for p in pending]
        if all(isinstance(t, int) for t in counts):  # host integers: one small copy
            totals = torch.tensor(counts, dtype=sums.dtype, device=sums.device)
        else:
            totals = torch.stack([as_count_tensor(t, sums.device) for t in counts])
        # torch annotates tolist() as a bare list
        losses = cast(list[float], (sums / totals).tolist())  # pyright: ignore[reportUnknownMemberType]
        host_totals = cast(list[float], totals.tolist())  # pyright: ignore[reportUnknownMemberType]
        for p, total in zip(pending, host_totals, strict=True):
            check_window_total(int(total), p.step)  # before the NaN that 0/0 makes is reported
        for p, value in zip(pending, losses, strict=True):
            if not math.isfinite(value):
                raise NonFiniteLossError(
                    f"loss is {value} at step {p.step}; stopping before it reaches a "
                    "checkpoint (the last good checkpoint stays)"
                )
        return [(p.step, value) for p, value in zip(pending, losses, strict=True)]


def _every(step: int, period: int | None) -> bool:
    return period is not None and step % period == 0
