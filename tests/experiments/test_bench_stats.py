"""The arithmetic every speedup figure goes through."""

import math

import pytest

from kiln.experiments.bench_stats import geomean, median, percentile, speedup_stats


def test_percentile_interpolates_like_numpy():
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 25) == pytest.approx(1.75)
    assert percentile(values, 75) == pytest.approx(3.25)
    assert median([5.0, 1.0, 3.0]) == 3.0
    assert median(values) == pytest.approx(2.5)


def test_percentile_rejects_bad_input():
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)
    with pytest.raises(ValueError, match=r"\[0, 100\]"):
        percentile([1.0], 101)


def test_geomean():
    assert geomean([2.0, 0.5]) == pytest.approx(1.0)
    assert geomean([1.0, 2.0, 4.0]) == pytest.approx(2.0)
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
    ratios = [2.0, 4.0, 2.0, 10.0]
    assert stats["speedup_p25"] == pytest.approx(percentile(ratios, 25))
    assert stats["speedup_p75"] == pytest.approx(percentile(ratios, 75))
    assert stats["speedup_p25"] <= stats["speedup_p75"]


def test_speedup_stats_needs_pairs():
    with pytest.raises(ValueError, match="same, non-zero number"):
        speedup_stats([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="same, non-zero number"):
        speedup_stats([], [])
