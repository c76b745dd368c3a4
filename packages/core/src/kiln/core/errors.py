"""Why a run stops: the exceptions ``fit`` raises for a broken run, and the checks behind them."""

from __future__ import annotations


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite; the run stops before saving it."""


class NonFiniteGradientError(NonFiniteLossError):
    """The gradient norm became NaN or infinite under gradient clipping."""


class EmptyWindowError(ValueError):
    """A window's micro-batches hold no items to average over (e.g. every label is -100)."""


def check_window_total(total: int, step: int) -> None:
    """Raise :class:`EmptyWindowError` if the window of ``step`` counts no items."""
    if total == 0:
        raise EmptyWindowError(
            f"the window of micro-batches for step {step} counts 0 items over all ranks "
            "(count_items(batch) summed to 0: e.g. every label is -100), so it has no mean "
            "loss; each window needs at least 1 item: filter out batches with no label tokens"
        )
