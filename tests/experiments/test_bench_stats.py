"""The arithmetic every speedup figure goes through."""

import math

import numpy as np
import pytest

from kiln.experiments.bench.stats import (
    bootstrap_median_interval,
    bootstrap_speedup_interval,
    geomean,
    speedup_stats,
)


def test_geomean():
    assert geomean([2.0, 0.5]) == pytest.approx(1.0)
    assert geomean([1.0, 2.0, 4.0]) == pytest.approx(2.0)
    assert geomean(x for x in [3.0]) == pytest.approx(3.0)  # any iterable
    assert geomean([]) is None
    for bad in ([1.0, 0.0], [1.0, -2.0], [math.nan], [math.inf]):
        with pytest.raises(ValueError, match="positive finite"):
            geomean(bad)


def test_speedup_stats_uses_medians_and_per_pair_ratios():
    eager = [2.0, 4.0, 3.0, 10.0]  # one slow outlier: medians ignore it
    compiled = [1.0, 1.0, 1.5, 1.0]
    stats = speedup_stats(eager, compiled)
    assert stats["eager_median_s"] == pytest.approx(3.5)
    assert stats["compiled_median_s"] == pytest.approx(1.0)
    assert stats["speedup"] == pytest.approx(3.5)
    # Per-pair ratios [2, 4, 2, 10], sorted [2, 2, 4, 10]; linear interpolation at
    # positions 0.75 and 2.25: 2 + 0 * 0.75 = 2.0 and 4 + 6 * 0.25 = 5.5.
    assert stats["speedup_p25"] == pytest.approx(2.0)
    assert stats["speedup_p75"] == pytest.approx(5.5)
    # Sorted eager [2, 3, 4, 10]: q25 = 2.75, q75 = 5.5; compiled [1, 1, 1, 1.5]: 1.0, 1.125.
    assert stats["eager_iqr_s"] == pytest.approx(2.75)
    assert stats["compiled_iqr_s"] == pytest.approx(0.125)


def test_speedup_stats_needs_pairs():
    with pytest.raises(ValueError, match="same, non-zero number"):
        speedup_stats([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="same, non-zero number"):
        speedup_stats([], [])


def test_bootstrap_interval_separates_a_real_speedup_from_noise():
    rng = np.random.default_rng(1)
    eager = 0.010 + 0.001 * rng.random(20)
    faster = speedup_stats(eager, eager / 1.5 + 0.0002 * rng.random(20))
    assert faster["speedup_ci_low"] <= faster["speedup"] <= faster["speedup_ci_high"]
    assert faster["speedup_ci_low"] > 1.2 and faster["significant"] is True
    same = speedup_stats(eager, 0.010 + 0.001 * rng.random(20))  # same distribution
    assert same["speedup_ci_low"] < 1.0 < same["speedup_ci_high"]
    assert same["significant"] is False
    slower = speedup_stats(eager, eager * 2)
    assert slower["speedup_ci_high"] == pytest.approx(0.5) and slower["significant"] is True


def test_bootstrap_interval_is_reproducible_and_wider_with_fewer_pairs():
    rng = np.random.default_rng(2)
    eager, compiled = 1 + rng.random(40), 1 + rng.random(40)
    assert bootstrap_speedup_interval(eager, compiled) == bootstrap_speedup_interval(
        eager, compiled
    )
    low40, high40 = bootstrap_speedup_interval(eager, compiled)
    low5, high5 = bootstrap_speedup_interval(eager[:5], compiled[:5])
    assert high5 - low5 > high40 - low40


def test_median_interval_holds_the_median_and_narrows_with_more_rounds():
    ratios = 1.0 + 0.1 * np.random.default_rng(3).standard_normal(41)
    low41, high41 = bootstrap_median_interval(ratios)
    assert low41 <= float(np.median(ratios)) <= high41
    assert bootstrap_median_interval(ratios) == (low41, high41)  # seeded
    low7, high7 = bootstrap_median_interval(ratios[:7])
    assert high7 - low7 > high41 - low41
    assert bootstrap_median_interval([1.03] * 5) == (pytest.approx(1.03), pytest.approx(1.03))


def _hand_written(samples, statistic, paired, seed=0, resamples=2000):
    """The percentile bootstrap kiln drew itself before it used scipy's: ``resamples`` rows
    of indices per sample (one row set for paired samples), the 2.5th and 97.5th percentile."""
    rng = np.random.default_rng(seed)
    data = [np.asarray(s, dtype=float) for s in samples]
    picks = [rng.integers(0, len(data[0]), (resamples, len(data[0])))] * len(data)
    if not paired:
        picks = [picks[0], *(rng.integers(0, len(d), (resamples, len(d))) for d in data[1:])]
    estimates = statistic(*(d[p] for d, p in zip(data, picks, strict=True)))
    low, high = np.percentile(estimates, [2.5, 97.5])
    return float(low), float(high)


@pytest.mark.parametrize("n", [3, 20, 150])
def test_scipy_bootstrap_gives_the_hand_written_intervals(n):
    from kiln.experiments.bench.stats import bootstrap_ratio_interval

    rng = np.random.default_rng(n)
    eager = 0.010 + 0.002 * rng.random(n)
    compiled = eager / 1.3 + 0.001 * rng.random(n)
    ratio = lambda a, b: np.median(a, axis=1) / np.median(b, axis=1)  # noqa: E731
    median = lambda a: np.median(a, axis=1)  # noqa: E731
    for seed in (0, 7):
        assert bootstrap_speedup_interval(eager, compiled, seed) == pytest.approx(
            _hand_written((eager, compiled), ratio, paired=True, seed=seed), rel=1e-12
        )
        assert bootstrap_ratio_interval(eager, compiled[: n // 2 + 1], seed) == pytest.approx(
            _hand_written((eager, compiled[: n // 2 + 1]), ratio, paired=False, seed=seed),
            rel=1e-12,
        )
        assert bootstrap_median_interval(eager, seed) == pytest.approx(
            _hand_written((eager,), median, paired=False, seed=seed), rel=1e-12
        )


def test_one_pair_has_no_spread():
    assert bootstrap_speedup_interval([2.0], [1.0]) == (2.0, 2.0)
