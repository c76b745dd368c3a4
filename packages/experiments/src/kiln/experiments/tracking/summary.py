"""What a job's record puts into its W&B run's summary."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

NOT_SUMMARIZED = ("config", "wandb", "metrics")
"""Record entries kept out of the summary: the W&B config and run already hold the first two,
``metrics`` goes in at the top level (``val/accuracy``)."""


def wandb_summary(record: dict[str, Any], scalars: Iterable[str] = ()) -> dict[str, Any]:
    """A job's W&B summary: its final ``metrics`` at the top level, every dict the record
    holds under its own name (``telemetry``, ``machine``, or any block a job adds later:
    ``telemetry/compile_time_s``), and the record's ``scalars`` named.

    Args:
        record: The job's record (``summary.json``, ``bench.json``).
        scalars: Plain record entries to add (``global_step``, ``seed``).
    """
    blocks = {k: v for k, v in record.items() if isinstance(v, dict) and k not in NOT_SUMMARIZED}
    return {
        **(record.get("metrics") or {}),
        **blocks,
        **{k: record.get(k) for k in scalars},
    }
