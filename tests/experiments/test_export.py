"""kiln-export, kiln-eval and the callbacks group, on runs shared by the module: one kiln-train
multirun (a tiny BERT classifier, a tiny Llama LM, a tiny ResNet and a tiny ViT, each with
callbacks=ema, checkpoints and an offline W&B run), exported by kiln-export and loaded by a
fresh process that never imports kiln, and evaluated by kiln-eval."""

from __future__ import annotations

import json

import pytest
import torch
from checkpoint_files import saved_state
from export_helpers import export_case, kiln, plain_outputs
from train_helpers import explain, job_dirs, run_train, summary

from kiln.experiments.jobs.trained_model import load_trained_module, resolve_checkpoint

EXPERIMENTS = ["bert_text", "tiny_llama_lm", "cnn_digits", "vit_digits"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The job dirs of one multirun over the four experiments, tiny, with EMA."""
    log_dir = tmp_path_factory.mktemp("export")
    proc = run_train(
        [
            "-m",
            f"experiment={','.join(EXPERIMENTS)}",
            "debug=fast",
            "trainer.max_steps=3",
            "compile.backend=aot_eager",
            "callbacks=ema",
            "callbacks.ema.decay=0.5",
            # validated with the trained weights, so kiln-eval of the checkpoint must match
            "callbacks.ema.validate_with_ema=false",
            "trainer.checkpoint_dir=${paths.output_dir}/checkpoints",
        ],
        log_dir,
        timeout=1200,
    )
    assert proc.returncode == 0, explain(proc)
    jobs = job_dirs(log_dir)
    return {summary(job)["config"]["name"]: job for job in jobs}


def test_callbacks_ema_trains_and_checkpoints_the_average(trained, tmp_path):
    for name, job in trained.items():
        record = summary(job)
        assert record["status"] == "ok", (name, record.get("error"))
        assert record["global_step"] == 3
        checkpoint = resolve_checkpoint(job)
        saved = saved_state(checkpoint, tmp_path)
        average = saved["callbacks"]["EMA"]["weights"]
        trained_weights = saved["model"]
        assert set(average) <= set(trained_weights), name
        # decay 0.5 over 3 steps: the average differs from the trained weights
        assert any(not torch.equal(average[k], trained_weights[k]) for k in average), name


@pytest.fixture(scope="module")
def exports(trained, tmp_path_factory):
    """Each job dir exported by kiln-export: name -> out dir."""
    root = tmp_path_factory.mktemp("exported")
    for name, job in trained.items():
        proc = kiln("export", job, root / name)
        assert proc.returncode == 0, explain(proc)
    return {name: root / name for name in trained}


def test_export_loads_in_plain_libraries_with_identical_outputs(trained, exports, tmp_path):
    cases, expected = {}, {}
    for name, job in trained.items():
        out = exports[name]
        record = json.loads((out / "kiln_export.json").read_text())
        assert record["checkpoint"] == str(resolve_checkpoint(job).resolve())
        module, _ = load_trained_module(record["checkpoint"])
        cases[name], expected[name] = export_case(module, out)
    assert sorted(cases) == sorted(EXPERIMENTS)
    got = plain_outputs(cases, tmp_path)
    for name in EXPERIMENTS:
        assert torch.equal(got[name], expected[name]), name


def test_eval_of_a_job_dir_matches_its_final_validation_and_logs_to_its_wandb_run(trained):
    job = trained["cnn_digits"]
    record = summary(job)
    # debug=fast validates on 2 batches
    proc = kiln("eval", job, "--limit-batches", 2)
    assert proc.returncode == 0, explain(proc)
    evaluated = job.parent / f"{job.name}-eval"  # beside the job: nothing written into it
    result = json.loads((evaluated / "eval.json").read_text())
    assert set(result["metrics"]) == set(record["metrics"])
    for key, value in record["metrics"].items():
        assert result["metrics"][key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    assert result["global_step"] == 3 and result["split"] == "validation"
    run_id = record["wandb"]["run_id"]
    assert result["wandb"]["run_id"] == run_id
    from kiln.experiments.tracking.wandb_files import read_summary

    trained_in = [p for p in (job / "wandb").glob(f"offline-run-*-{run_id}") if p.is_dir()]
    assert len(trained_in) == 1, trained_in  # the training run; kiln-eval's resume is beside
    resumed = [p for d in (job, evaluated) for p in (d / "wandb").glob(f"offline-run-*-{run_id}")]
    assert len(resumed) == 2, resumed  # the training run and kiln-eval's resume of it
    logged = [read_summary(next(p.glob("*.wandb"))) for p in resumed]
    assert any(s.get("eval/val/accuracy") == result["metrics"]["val/accuracy"] for s in logged)


def test_eval_of_an_export_matches_its_checkpoint_and_test_split_is_refused(trained, exports):
    name = "bert_text"
    proc = kiln("eval", exports[name], "--limit-batches", 2, "--wandb-mode", "disabled")
    assert proc.returncode == 0, explain(proc)
    result = json.loads((exports[name] / "eval.json").read_text())
    for key, value in summary(trained[name])["metrics"].items():
        assert result["metrics"][key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    proc = kiln("eval", trained[name], "--split", "test", "--wandb-mode", "disabled")
    assert proc.returncode == 2
    assert "has no test split" in proc.stderr and "split=validation" in proc.stderr


def test_export_of_a_path_without_checkpoints_says_where_it_looked(tmp_path):
    proc = kiln("export", tmp_path, tmp_path / "out")
    assert proc.returncode == 2
    assert "no checkpoint found" in proc.stderr and str(tmp_path / "checkpoints") in proc.stderr
