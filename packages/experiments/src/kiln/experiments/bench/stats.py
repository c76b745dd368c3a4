"""The arithmetic of a speedup table: medians, spreads, intervals and geometric means
(numpy, ``statistics`` and ``scipy.stats.bootstrap`` do the arithmetic; this module fixes
which figure is which).

Shared by the harness (one job's speedup and spread) and the report (a sweep's summary),
so both compute a figure the same way.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from kiln.experiments.bench.record import SpeedupStats


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


BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95


def _interval(estimates: np.ndarray) -> tuple[float, float]:
    """The percentile-bootstrap ``CONFIDENCE`` interval of resampled ``estimates``."""
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(estimates, [tail, 100 - tail])
    return float(low), float(high)


def _median_ratio(num: np.ndarray, den: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(num, axis=axis) / np.median(den, axis=axis)


def _bootstrap(
    samples: tuple[Sequence[float], ...], statistic: Any, *, paired: bool, seed: int
) -> tuple[float, float]:
    """``scipy.stats.bootstrap``'s seeded percentile ``CONFIDENCE`` interval of
    ``statistic(*samples)`` over ``BOOTSTRAP_RESAMPLES`` resamples (``paired``: the samples'
    i-th values are drawn together). A sample of one value has no spread: its interval is
    the figure itself."""
    data = tuple(np.asarray(sample, dtype=float) for sample in samples)
    if min(len(d) for d in data) < 2:
        value = float(statistic(*data, axis=-1))
        return value, value
    from scipy.stats import bootstrap  # imported on use: kiln-report --help stays quick

    result = bootstrap(
        data,
        statistic,
        paired=paired,
        vectorized=True,
        n_resamples=BOOTSTRAP_RESAMPLES,
        confidence_level=CONFIDENCE,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def bootstrap_speedup_interval(
    eager_s: Sequence[float], compiled_s: Sequence[float], seed: int = 0
) -> tuple[float, float]:
    """A percentile-bootstrap 95% interval of the speedup (median eager / median compiled).

    The interleaved pairs are resampled together (a pair shares the machine's state at its
    moment), so the interval reflects how much the figure moves with the measured noise.
    Seeded: the same timings always give the same interval.
    """
    return _bootstrap((eager_s, compiled_s), _median_ratio, paired=True, seed=seed)


def bootstrap_median_interval(values: Sequence[float], seed: int = 0) -> tuple[float, float]:
    """A percentile-bootstrap 95% interval of ``median(values)``: for per-round ratios of
    interleaved runs (each round's ratio already pairs the runs that shared its moment).

    Seeded: the same values always give the same interval.
    """
    return _bootstrap((values,), np.median, paired=False, seed=seed)


def bootstrap_ratio_interval(
    num_s: Sequence[float], den_s: Sequence[float], seed: int = 0
) -> tuple[float, float]:
    """A percentile-bootstrap 95% interval of ``median(num_s) / median(den_s)`` for two
    independent samples (two runs' step times: nothing pairs them), each resampled alone.

    Seeded: the same timings always give the same interval.
    """
    return _bootstrap((num_s, den_s), _median_ratio, paired=False, seed=seed)


def bootstrap_runs_ratio_interval(
    num_runs: Sequence[Sequence[float]], den_runs: Sequence[Sequence[float]], seed: int = 0
) -> tuple[float, float]:
    """A two-level percentile-bootstrap 95% interval of ``median of num_runs' medians /
    median of den_runs' medians``: each resample draws runs (repeats of one configuration)
    with replacement, and each drawn run's step times with replacement, so the interval holds
    the between-run spread as well as the within-run one (``scipy.stats.bootstrap`` resamples
    one level only, so this one is drawn here). Within a run, step times are drawn in moving
    blocks (:func:`block_resamples`).

    Seeded: the same timings always give the same interval.
    """
    rng = np.random.default_rng(seed)

    def side(runs: Sequence[Sequence[float]]) -> np.ndarray:
        medians = np.stack(  # (runs, resamples): each run's resampled medians
            [
                np.median(np.asarray(r, dtype=float)[block_resamples(rng, len(r))], axis=1)
                for r in runs
            ]
        )
        picks = rng.integers(0, len(runs), (BOOTSTRAP_RESAMPLES, len(runs)))
        return np.median(medians[picks, np.arange(BOOTSTRAP_RESAMPLES)[:, None]], axis=1)

    return _interval(side(num_runs) / side(den_runs))


def block_resamples(rng: np.random.Generator, n: int, block: int | None = None) -> np.ndarray:
    """``BOOTSTRAP_RESAMPLES`` rows of ``n`` indices made of moving blocks: runs of ``block``
    consecutive indices (``round(sqrt(n))`` by default) from random starts, end to end, cut
    to ``n``. Step times are a time series: a burst of slow steps is resampled as a burst,
    and widens the interval instead of spreading thin as single draws would."""
    block = min(max(1, block or round(math.sqrt(n))), n)
    starts = rng.integers(0, n - block + 1, (BOOTSTRAP_RESAMPLES, -(-n // block)))
    return (starts[:, :, None] + np.arange(block)).reshape(BOOTSTRAP_RESAMPLES, -1)[:, :n]


def block_median_interval(values: Sequence[float], seed: int = 0) -> tuple[float, float]:
    """A moving-block bootstrap 95% interval of ``median(values)`` (a run's step times, in
    order). Seeded: the same values always give the same interval."""
    data = np.asarray(values, dtype=float)
    if len(data) < 2:
        return float(np.median(data)), float(np.median(data))
    picks = block_resamples(np.random.default_rng(seed), len(data))
    return _interval(np.median(data[picks], axis=1))


def block_ratio_interval(
    num_s: Sequence[float], den_s: Sequence[float], seed: int = 0
) -> tuple[float, float]:
    """A moving-block bootstrap 95% interval of ``median(num_s) / median(den_s)`` for two
    runs' step times (each in the order it ran, each resampled alone in blocks).

    Seeded: the same timings always give the same interval.
    """
    num, den = (np.asarray(s, dtype=float) for s in (num_s, den_s))
    if min(len(num), len(den)) < 2:
        value = float(np.median(num) / np.median(den))
        return value, value
    rng = np.random.default_rng(seed)
    picks = [block_resamples(rng, len(d)) for d in (num, den)]
    return _interval(_median_ratio(num[picks[0]], den[picks[1]]))


def band_ratio_interval(
    num_median: float, num_iqr: float, den_median: float, den_iqr: float
) -> tuple[float, float]:
    """A conservative interval of ``num_median / den_median`` when only medians and IQRs are
    known (no per-step times to bootstrap): the ratio of the two interquartile bands
    ``median +- IQR/2``, from lowest over highest to highest over lowest. It spans 1.0 exactly
    when the two bands overlap.

    Returns:
        ``(low, high)``; ``high`` is ``inf`` when the denominator's band reaches zero.
    """
    num_low, num_high = num_median - num_iqr / 2, num_median + num_iqr / 2
    den_low, den_high = den_median - den_iqr / 2, den_median + den_iqr / 2
    low = max(num_low, 0.0) / den_high if den_high > 0 else math.inf
    high = num_high / den_low if den_low > 0 else math.inf
    return float(low), float(high)


def speedup_stats(eager_s: Sequence[float], compiled_s: Sequence[float]) -> SpeedupStats:
    """Speedup of interleaved timings: median eager / median compiled, spread and interval.

    ``eager_s[i]`` and ``compiled_s[i]`` are the i-th pair of an A B A B ... sequence; the
    spread is the 25th and 75th percentile of the per-pair ratios ``eager_s[i] / compiled_s[i]``;
    ``speedup_ci_low``/``speedup_ci_high`` the bootstrap 95% interval of the speedup, and
    ``significant`` whether that interval excludes 1.0 (a real win or loss, not noise).

    Raises:
        ValueError: If the sequences are empty or of different lengths.
    """
    if len(eager_s) == 0 or len(eager_s) != len(compiled_s):
        raise ValueError(
            f"need the same, non-zero number of eager and compiled timings, "
            f"got {len(eager_s)} and {len(compiled_s)}"
        )
    ratios = np.asarray(eager_s, dtype=float) / np.asarray(compiled_s, dtype=float)
    ratio_q25, ratio_q75 = np.percentile(ratios, [25, 75])
    eager_q25, eager_median, eager_q75 = np.percentile(eager_s, [25, 50, 75])
    compiled_q25, compiled_median, compiled_q75 = np.percentile(compiled_s, [25, 50, 75])
    ci_low, ci_high = bootstrap_speedup_interval(eager_s, compiled_s)
    return {
        "speedup": float(eager_median / compiled_median),
        "speedup_ci_low": ci_low,
        "speedup_ci_high": ci_high,
        "significant": bool(ci_low > 1.0 or ci_high < 1.0),
        "speedup_p25": float(ratio_q25),
        "speedup_p75": float(ratio_q75),
        "eager_median_s": float(eager_median),
        "compiled_median_s": float(compiled_median),
        "eager_iqr_s": float(eager_q75 - eager_q25),
        "compiled_iqr_s": float(compiled_q75 - compiled_q25),
    }
