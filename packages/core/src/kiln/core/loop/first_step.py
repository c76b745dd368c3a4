"""The one-off work of a fit's first optimizer step.

A few things need a real window of the run and are done once: the FLOP count of a
micro-batch (before the timed step), the precision audit (around the first window's forward
and backward), the check that ``training_step``'s ``num_items`` is what ``count_items``
counts, and the gradients' size (between the backward and ``zero_grad``). ``fit`` hands
:class:`FirstStep` to its first ``train_step`` and :data:`LATER_STEPS`, which does nothing,
to every other.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from contextlib import contextmanager
from typing import Any

import torch

from kiln.core.loop.activation_checkpointing import paused
from kiln.core.loop.precision_audit import auditing
from kiln.core.module_contract import count_items
from kiln.core.state import Context, RunState
from kiln.core.telemetry.flops import count_micro_batch_flops
from kiln.core.telemetry.memory import grad_bytes

log = logging.getLogger(__name__)


class StepExtras:
    """What a step does besides training: nothing (every step after the first)."""

    def before(self, window: list[Any]) -> None:
        """Before the timed step."""

    @contextmanager
    def around_window(self) -> Generator[None]:
        """Around the window's forwards and backwards."""
        yield

    def after_backward(self, window: list[Any], items: list[Any]) -> None:
        """After the window's backwards, before the update."""


LATER_STEPS = StepExtras()


class FirstStep(StepExtras):
    """The first step's one-off measurements and checks, into ``run``."""

    def __init__(self, ctx: Context, run: RunState) -> None:
        self.ctx, self.run = ctx, run

    def before(self, window: list[Any]) -> None:
        ctx = self.ctx
        if ctx.count_flops:
            with paused(ctx.module, ctx.activation_checkpointing):  # recomputation adds no FLOPs
                self.run.micro_batch_flops = count_micro_batch_flops(ctx.module, window[0])

    @contextmanager
    def around_window(self) -> Generator[None]:
        """With ``trainer.precision_audit``, audit the window (eagerly, also when compiled: the
        audit sees aten ops) into ``run.precision_audit``, and warn if an op did not run as
        the precision says."""
        ctx = self.ctx
        if not ctx.trainer.precision_audit:
            yield
            return
        with (
            torch.compiler.set_stance("force_eager"),
            auditing(ctx.module, ctx.trainer.precision) as audit,
        ):
            yield
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

    def after_backward(self, window: list[Any], items: list[Any]) -> None:
        """The items each micro-batch's loss was weighted by are the items ``count_items``
        counts (raised before the update), and the gradients' size, which exist only now."""
        for batch, reported in zip(window, items, strict=True):
            _check_counts(reported, count_items(self.ctx.module, batch))
        self.run.grad_bytes = grad_bytes(self.ctx.module)


def _check_counts(reported: Any, counted: Any) -> None:
    if int(reported) != int(counted):
        raise ValueError(
            f"training_step reported num_items={int(reported)} but count_items(batch) gives "
            f"{int(counted)}; define count_items(batch) on the module to count what the loss "
            "averages over (e.g. non-padding label tokens)"
        )
