"""The arithmetic of a speedup table: medians, percentiles, geometric means, pass rates.

Shared by the harness (one job's speedup and spread) and the report (a sweep's summary),
so both compute a figure the same way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, linearly interpolated (numpy's default).

    Raises:
        ValueError: If ``values`` is empty or ``q`` is outside [0, 100].
    """
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0 <= q <= 100:
        raise ValueError(f"q={q!r} must be in [0, 100]")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def median(values: Sequence[float]) -> float:
    """The median of ``values``."""
    return percentile(values, 50)


def geomean(values: Iterable[float]) -> float | None:
    """Geometric mean of positive ``values``; ``None`` when there are none.

    Raises:
        ValueError: If a value is not a positive finite number (a speedup never is).
    """
    logs = []
    for value in values:
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ValueError(f"geometric mean needs positive finite values, got {value!r}")
        logs.append(math.log(value))
    return math.exp(sum(logs) / len(logs)) if logs else None


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
    ratios = [e / c for e, c in zip(eager_s, compiled_s, strict=True)]
    eager_median, compiled_median = median(eager_s), median(compiled_s)
    return {
        "speedup": eager_median / compiled_median,
        "speedup_p25": percentile(ratios, 25),
        "speedup_p75": percentile(ratios, 75),
        "eager_median_s": eager_median,
        "compiled_median_s": compiled_median,
        "eager_iqr_s": percentile(eager_s, 75) - percentile(eager_s, 25),
        "compiled_iqr_s": percentile(compiled_s, 75) - percentile(compiled_s, 25),
    }
