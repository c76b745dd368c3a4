"""hparams_search=default_lr: a small Optuna study on the CPU, ranked by kiln-report."""

from __future__ import annotations

import csv

import pytest
from omegaconf import OmegaConf
from train_helpers import FAST, explain, job_dirs, run_train, summary

from kiln.experiments.report.cli import main as report_main


@pytest.mark.slow
def test_three_trial_study_returns_the_metric_to_optuna_and_reports_ranked(tmp_path):
    proc = run_train(["hparams_search=default_lr", *FAST, "hydra.sweeper.n_trials=3"], tmp_path)
    assert proc.returncode == 0, explain(proc)
    jobs = job_dirs(tmp_path)
    assert len(jobs) == 3
    records = [summary(job) for job in jobs]
    assert all(r["status"] == "ok" for r in records), [r.get("error") for r in records]
    losses = [r["metrics"]["val/loss"] for r in records]
    lrs = {r["config"]["optimizer"]["lr"] for r in records}
    assert len(lrs) == 3 and all(1e-5 <= lr <= 1e-2 for lr in lrs)
    # each trial is one W&B run, all in the study's group
    groups = {r["wandb"]["group"] for r in records}
    assert len(groups) == 1 and None not in groups
    assert len({r["wandb"]["run_id"] for r in records}) == 3
    # Optuna got each trial's val/loss: its best is the smallest
    sweep = jobs[0].parent
    results = OmegaConf.load(sweep / "optimization_results.yaml")
    assert results.best_value == min(losses)

    assert report_main([str(sweep), "--quiet"]) == 0
    with open(sweep / "study.csv") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["val/loss"]) for r in rows] == sorted(losses)
    assert [r["rank"] for r in rows] == ["1", "2", "3"]
    assert (sweep / "study_optimizer_lr.png").is_file()
    assert (sweep / "study_optimizer_weight_decay.png").is_file()


def test_the_sweeper_direction_follows_optimized_metric_mode():
    from train_helpers import compose_train

    for mode, direction in (("min", "minimize"), ("max", "maximize")):
        cfg = compose_train(
            ["hparams_search=default_lr", f"optimized_metric.mode={mode}"], hydra_config=True
        )
        assert cfg.hydra.sweeper.direction == direction


@pytest.fixture(scope="module")
def max_study(tmp_path_factory):
    """A 3-trial study that maximizes val/loss (so a minimizing one would pick another)."""
    log_dir = tmp_path_factory.mktemp("max_study")
    args = ["hparams_search=default_lr", *FAST, "hydra.sweeper.n_trials=3"]
    proc = run_train(
        [*args, "optimized_metric.name=val/loss", "optimized_metric.mode=max"], log_dir
    )
    assert proc.returncode == 0, explain(proc)
    return job_dirs(log_dir)


def test_a_study_with_mode_max_maximizes(max_study):
    """Optuna's best trial of ``optimized_metric.mode=max`` is the largest value."""
    losses = [summary(job)["metrics"]["val/loss"] for job in max_study]
    assert len(set(losses)) == 3
    results = OmegaConf.load(max_study[0].parent / "optimization_results.yaml")
    assert results.best_value == max(losses)


def test_study_plots_put_log_searched_parameters_on_a_log_axis_and_mark_the_best(max_study):
    from kiln.experiments.report.load import load_sweep
    from kiln.experiments.report.plots import scatter_figure
    from kiln.experiments.report.study import log_params, study_plots, study_rows

    root = max_study[0].parent
    records = load_sweep(root).train
    params = ["optimizer.lr", "optimizer.weight_decay"]
    assert log_params(root, records) == {"optimizer.lr"}  # tag(log, interval(...))
    metric, rows = study_rows(records, params)
    specs = {s["xlabel"]: s for s in study_plots(rows, params, metric, log_params(root, records))}
    best_lr = max(records, key=lambda r: r["metrics"]["val/loss"])["config"]["optimizer"]["lr"]
    assert specs["optimizer.lr"]["best"][0] == pytest.approx(best_lr)  # mode=max: the largest
    for param, scale in (("optimizer.lr", "log"), ("optimizer.weight_decay", "linear")):
        ax = scatter_figure(**specs[param]).axes[0]
        assert ax.get_xscale() == scale
        (star,) = [c for c in ax.collections if c.get_label().startswith("best trial: ")]
        assert tuple(star.get_offsets()[0]) == pytest.approx(specs[param]["best"])
    assert report_main([str(root), "--quiet"]) == 0
    assert (root / "study_optimizer_lr.png").is_file()


def test_a_direction_that_contradicts_the_mode_fails_before_any_trial(tmp_path):
    args = ["hparams_search=default_lr", *FAST, "optimized_metric.mode=max"]
    proc = run_train([*args, "hydra.sweeper.direction=minimize"], tmp_path)
    assert proc.returncode == 1, explain(proc)
    assert "hydra.sweeper.direction=minimize but optimized_metric.mode=max" in proc.stderr
    assert not (tmp_path / "multirun").exists()  # no trial ran
