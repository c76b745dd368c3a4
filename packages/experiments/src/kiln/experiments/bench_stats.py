"""The arithmetic of a speedup table: medians, spreads and geometric means (numpy and
``statistics`` do the arithmetic; this module fixes which figure is which).

Shared by the harness (one job's speedup and spread) and the report (a sweep's summary),
so both compute a figure the same way.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

import numpy as np


def geomean(values: Iterable[float]) -> float | None:
    """Geometric mean of positive ``values``; ``None`` when there are none.

    Raises:
        ValueError: If a value is not a positive finite number (a speedup never is).
    """
    values = list(values)
    for value in values:
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ValueError(f"geometric mean needs positive finite values, got {value!r}")
    return statistics.geometric_mean(values) if values else None


def speedup_stats(eager_s: Sequence[float], compiled_s: Sequence[float]) -> dict[str, float]:
    """Speedup of interleaved timings: median eager / median compiled, and the spread.

    ``eager_s[i]`` and ``compiled_s[i]`` are the i-th pair of an A B A B ... sequence; the
    spread is the 25th and 75th percentile of the per-pair ratios ``eager_s[i] / compiled_s[i]``.

    Raises:
        ValueError: If the sequences are empty or of different lengths.
    """
    if not eager_s or len(eager_s) != len(compiled_s):
        raise ValueError(
            f"need the same, non-zero number of eager and compiled timings, "
            f"got {len(eager_s)} and {len(compiled_s)}"
        )
    ratios = np.asarray(eager_s, dtype=float) / np.asarray(compiled_s, dtype=float)
    ratio_q25, ratio_q75 = np.percentile(ratios, [25, 75])
    eager_q25, eager_median, eager_q75 = np.percentile(eager_s, [25, 50, 75])
    compiled_q25, compiled_median, compiled_q75 = np.percentile(compiled_s, [25, 50, 75])
    return {
        "speedup": float(eager_median / compiled_median),
        "speedup_p25": float(ratio_q25),
        "speedup_p75": float(ratio_q75),
        "eager_median_s": float(eager_median),
        "compiled_median_s": float(compiled_median),
        "eager_iqr_s": float(eager_q75 - eager_q25),
        "compiled_iqr_s": float(compiled_q75 - compiled_q25),
    }
