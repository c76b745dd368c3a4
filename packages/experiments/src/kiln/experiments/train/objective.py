"""What a kiln-train job returns to Hydra's sweeper: the value of ``optimized_metric``.

Optuna (``hparams_search=``) and other sweepers rank trials by it. A failed trial, or one
whose metric is NaN or infinite, returns the worst value for the mode (``+inf`` for
``min``, ``-inf`` for ``max``), never ``None``, so the study goes on and ranks it last.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MODES = ("min", "max")


@dataclass
class OptimizedMetric:
    """The metric a sweep optimizes.

    Args:
        name: A final metric of the run (``val/loss``, ``val/accuracy``, ``val/perplexity``
            ...); empty: the first validation metric the model reports.
        mode: ``min`` or ``max``: which way is better.
    """

    name: str = ""
    mode: str = "min"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"optimized_metric.mode={self.mode!r} is not valid; use min or max")

    @property
    def worst(self) -> float:
        """The value of a failed or non-finite trial."""
        return math.inf if self.mode == "min" else -math.inf


def objective_value(summary: dict[str, Any], metric: OptimizedMetric) -> float:
    """The job's value for the sweeper, from its summary (``status`` and ``metrics``).

    Raises:
        ValueError: The run succeeded but has no metric of that name; the message lists the
            metrics it has.
    """
    if summary.get("status") != "ok":
        return metric.worst
    metrics = summary.get("metrics") or {}
    if not metric.name:
        value = next(iter(metrics.values()), None)
    elif metric.name in metrics:
        value = metrics[metric.name]
    else:
        raise ValueError(
            f"optimized_metric.name={metric.name!r} is not a metric of this run; it has "
            f"{', '.join(metrics) or 'none (set trainer.val_every_n_steps or limit_val_batches)'}"
        )
    if value is None or not math.isfinite(float(value)):
        return metric.worst
    return float(value)
