"""A ratio between training runs as one type, and the table columns it is written to.

A report row is flat (one CSV column per cell), so a ratio lands in six columns: its figure,
interval, noise reason, verdict and which bootstrap gave the interval. :class:`RatioColumns`
names them once per ratio; :class:`Ratio` is what the report computes, prints and plots, and
:meth:`Ratio.columns` / :meth:`Ratio.from_row` are the only way between the two.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RatioColumns:
    """The columns of one ratio in a row (``train_runs.csv``)."""

    value: str
    """The figure's column (``speedup_vs_eager``)."""
    low: str
    high: str
    noise: str
    verdict: str
    bootstrap: str

    @classmethod
    def named(cls, value: str, prefix: str) -> RatioColumns:
        """``value`` and ``<prefix>_ci_low``, ``_ci_high``, ``_noise``, ``_verdict``,
        ``_bootstrap``."""
        return cls(
            value,
            f"{prefix}_ci_low",
            f"{prefix}_ci_high",
            f"{prefix}_noise",
            f"{prefix}_verdict",
            f"{prefix}_bootstrap",
        )

    @property
    def details(self) -> tuple[str, str, str, str, str]:
        """Every column but the figure's: the CSV keeps them, a printed table folds them
        into the figure's cell."""
        return (self.low, self.high, self.noise, self.verdict, self.bootstrap)

    @property
    def all(self) -> tuple[str, ...]:
        return (self.value, *self.details)


SPEEDUP = RatioColumns.named("speedup_vs_eager", "speedup")
"""The eager run's step time over this run's, same resolved config."""
SCALING = RatioColumns.named("scaling_efficiency", "scaling")
"""Throughput per device over the run with the fewest devices."""
STRATEGY = RatioColumns.named("speedup_vs_ddp", "strategy")
"""The DDP run's step time over this run's (another strategy, or activation checkpointing)."""
RATIOS = (SPEEDUP, SCALING, STRATEGY)


@dataclass
class Ratio:
    """A ratio of two runs' (or two sets of repeats') measurements, and whether it is a
    result."""

    value: float | None = None
    """The figure; ``None`` when the run has no partner (:attr:`verdict` says why)."""
    low: float | None = None
    """The 95% interval's low end (``None``: no spread to take one from)."""
    high: float | None = None
    noise: str | None = None
    """Why the figure is noise (``12 steps``, ``interval spans 1.0``), else ``None``."""
    verdict: str | None = None
    """``confounded: ...``, ``unverified: ...``, ``unpaired: ...`` or ``None``."""
    bootstrap: str | None = None
    """What the interval resampled (``within runs``, ``IQR bands``, ...)."""

    def columns(self, names: RatioColumns) -> dict[str, Any]:
        """The ratio as a row's cells."""
        return dict(
            zip(
                names.all,
                (self.value, self.low, self.high, self.noise, self.verdict, self.bootstrap),
                strict=True,
            )
        )

    @classmethod
    def from_row(cls, row: Mapping[str, Any], names: RatioColumns) -> Ratio:
        """The ratio a row's cells hold (a missing cell is ``None``)."""
        value, low, high, noise, verdict, bootstrap = (row.get(c) for c in names.all)
        return cls(value, low, high, noise, verdict, bootstrap)

    @property
    def confounded(self) -> bool:
        return bool(self.verdict and self.verdict.startswith("confounded"))

    def text(self, fmt: Callable[[float], str]) -> str | None:
        """The printed cell: ``"0.81 (confounded: calibration 0.55x)"``, ``"1.03 (noise: 12
        steps)"`` or ``"2.000 [1.905, 2.105]"``, followed by a verdict that is not
        ``confounded`` (``(unverified: no machine record)``); without a figure, the verdict."""
        if self.value is None:
            return self.verdict
        figure = fmt(self.value)
        if self.confounded:
            return f"{figure} ({self.verdict})"
        if self.noise:
            figure = f"{figure} (noise: {self.noise})"
        elif self.low is not None and self.high is not None:
            figure = f"{figure} [{fmt(self.low)}, {fmt(self.high)}]"
        return f"{figure} ({self.verdict})" if self.verdict else figure
