"""``test_after_fit=true``: after training, the data module's test split runs through the
model's metrics, into ``summary.json`` and the W&B run; checked against kiln-eval, which
rebuilds the model and data from the job's checkpoint."""

from __future__ import annotations

import json

import pytest
from export_helpers import kiln
from train_helpers import FAST, explain, job_dirs, run_train, summary

from kiln.experiments.tracking.wandb_files import read_summary

CHECKPOINTS = "trainer.checkpoint_dir=${paths.output_dir}/checkpoints"


def test_test_after_fit_reports_the_test_split_as_kiln_eval_computes_it(tmp_path):
    args = ["experiment=cnn_digits", *FAST, "data.test_fraction=0.1", "test_after_fit=true"]
    proc = run_train([*args, CHECKPOINTS], tmp_path)
    assert proc.returncode == 0, explain(proc)
    (job,) = job_dirs(tmp_path)
    record = summary(job)
    assert record["status"] == "ok", record.get("error")
    validation = {k.removeprefix("val/") for k in record["metrics"] if k.startswith("val/")}
    test = {k: v for k, v in record["metrics"].items() if k.startswith("test/")}
    assert {k.removeprefix("test/") for k in test} == validation, record["metrics"]
    out = tmp_path / "eval.json"
    proc = kiln("eval", job, "--split", "test", "--wandb-mode", "disabled", "--out", out)
    assert proc.returncode == 0, explain(proc)
    reference = json.loads(out.read_text())["metrics"]
    assert reference.keys() == test.keys()
    for key, value in reference.items():
        assert test[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    (run,) = (job / "wandb").glob(f"offline-run-*-{record['wandb']['run_id']}")
    logged = read_summary(next(run.glob("*.wandb")))
    assert {k: logged[k] for k in test} == test


@pytest.mark.slow
def test_test_after_fit_without_a_test_split_fails_before_training(tmp_path):
    proc = run_train([*FAST, "test_after_fit=true"], tmp_path)  # kiln's generated text
    assert proc.returncode != 0
    record = summary(job_dirs(tmp_path)[0])
    assert record["status"] == "failed" and record["global_step"] == 0
    assert "has no test split" in record["error"], record["error"]
