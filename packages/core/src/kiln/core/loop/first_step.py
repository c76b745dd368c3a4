"""The one-off work of a fit's first optimizer step, as a callback that leaves after it.

A few things need a real window of the run and are done once: the FLOP count of a
micro-batch (before the step's clock starts), the precision audit (around the first
window's forwards and backwards), the check that ``training_step``'s ``num_items`` is what
``count_items`` counts, and the gradients' size (between the backward and ``zero_grad``).
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from typing import Any

import torch

from kiln.core.callback_points import Callback
from kiln.core.loop.activation_checkpointing import paused
from kiln.core.loop.precision_audit import auditing
from kiln.core.loop.step import count_items
from kiln.core.state import Context, RunState
from kiln.core.telemetry.flops import count_micro_batch_flops
from kiln.core.telemetry.memory import grad_bytes

log = logging.getLogger(__name__)


class FirstStep(Callback):
    """The first step's one-off measurements and checks, into ``run``; it then removes
    itself from the run's callbacks."""

    def __init__(self, ctx: Context, run: RunState) -> None:
        self.ctx, self.run = ctx, run
        self._audit = ExitStack()

    def on_window_start(self, window: list[Any]) -> None:
        ctx = self.ctx
        if ctx.count_flops:
            with paused(ctx.module, ctx.activation_checkpointing):  # recomputation adds no FLOPs
                self.run.micro_batch_flops = count_micro_batch_flops(ctx.module, window[0])
        if ctx.trainer.precision_audit:  # eagerly, also when compiled: the audit sees aten ops
            self._audit.enter_context(torch.compiler.set_stance("force_eager"))
            self.audit = self._audit.enter_context(auditing(ctx.module, ctx.trainer.precision))

    def on_window_end(self, window: list[Any], num_items: list[Any], total: Any) -> None:
        """The items each micro-batch's loss was weighted by are the items ``count_items``
        counts (raised before the update), and the gradients' size, which exist only now."""
        self._audit.close()
        if self.ctx.trainer.precision_audit:
            self._report_audit()
        for batch, reported in zip(window, num_items, strict=True):
            _check_counts(reported, count_items(self.ctx, batch))
        self.run.grad_bytes = grad_bytes(self.ctx.module)
        self.ctx.callbacks.remove(self)

    def on_exception(self, error: BaseException) -> None:
        self._audit.close()

    def _report_audit(self) -> None:
        """Record the audit in ``run.precision_audit``; warn if an op did not run as the
        precision says."""
        ctx, audit = self.ctx, self.audit
        self.run.precision_audit = audit.record()
        problems = audit.problems()
        if problems and ctx.fabric.is_global_zero:
            where = list(dict.fromkeys(op.module or "(top level)" for op in problems))
            log.warning(
                "precision audit: %d ops did not run as trainer.precision=%s says, in %s%s "
                "(the telemetry's precision_audit lists them)",
                sum(op.count for op in problems),
                ctx.trainer.precision,
                ", ".join(where[:10]),
                f" and {len(where) - 10} more modules" if len(where) > 10 else "",
            )


def _check_counts(reported: Any, counted: Any) -> None:
    if int(reported) != int(counted):
        raise ValueError(
            f"training_step reported num_items={int(reported)} but count_items(batch) gives "
            f"{int(counted)}; define count_items(batch) on the module to count what the loss "
            "averages over (e.g. non-padding label tokens)"
        )
