"""The value a kiln-train job returns to Hydra's sweeper (optimized_metric)."""

import math

import pytest

from kiln.experiments.train.objective import OptimizedMetric, objective_value


def ok(**metrics):
    return {"status": "ok", "metrics": metrics}


@pytest.mark.parametrize("mode, worst", [("min", math.inf), ("max", -math.inf)])
def test_failed_or_non_finite_trials_return_the_worst_value_not_none(mode, worst):
    metric = OptimizedMetric("val/loss", mode)
    assert objective_value({"status": "failed", "metrics": {}}, metric) == worst
    assert objective_value(ok(**{"val/loss": math.nan}), metric) == worst
    assert objective_value(ok(**{"val/loss": -worst}), metric) == worst
    assert objective_value(ok(**{"val/accuracy": 0.5, "val/loss": 0.25}), metric) == 0.25


def test_default_is_the_first_metric_and_a_wrong_name_lists_the_run_metrics():
    assert objective_value(ok(**{"val/accuracy": 0.5, "val/loss": 0.25}), OptimizedMetric()) == 0.5
    with pytest.raises(ValueError, match=r"val/acc.*val/accuracy, val/loss"):
        objective_value(ok(**{"val/accuracy": 0.5, "val/loss": 0.25}), OptimizedMetric("val/acc"))
    with pytest.raises(ValueError, match=r"mode='best'.*min or max"):
        OptimizedMetric("val/loss", "best")
