"""A user's plugin package (tests/plugin_example), installed as users install one, trains in
every process of a job; its models run kiln's model contract tests with one command."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from export_helpers import export_case, kiln, plain_outputs
from train_helpers import FAST, explain, job_dirs, run_train, summary

import kiln.models as km
from kiln.experiments.jobs.trained_model import load_trained_module, resolve_checkpoint

PLUGIN_SRC = Path(__file__).resolve().parents[1] / "plugin_example"
SEARCHPATH = "hydra.searchpath=[pkg://kiln_plugin_example.configs]"
IMAGE = ["model=convnext-digits", "data=digits", SEARCHPATH, *FAST]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The example plugin installed (its .dist-info holds the ``kiln.plugins`` entry point)
    into a folder outside the project's venv; the env puts it on the subprocess's path."""
    target = tmp_path_factory.mktemp("site")
    uv = shutil.which("uv")
    assert uv, "uv installs the example plugin; put it on PATH"
    proc = subprocess.run(
        [uv, "pip", "install", "--no-deps", "--target", str(target), str(PLUGIN_SRC)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return {"PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")])}


def test_unknown_model_error_says_how_to_register_one():
    with pytest.raises(ValueError) as err:
        km.create_model("convnext-digitz")
    message = str(err.value)
    assert "unknown model 'convnext-digitz'" in message
    assert '[project.entry-points."kiln.plugins"]' in message
    assert "plugins=[" in message


@pytest.mark.process
def test_entry_point_plugin_model_trains_in_two_worker_processes(installed, tmp_path):
    # The spawned workers import nothing of the user's: they must load the entry point.
    proc = run_train([*IMAGE, "trainer.devices=2"], tmp_path, env=installed, process=True)
    assert proc.returncode == 0, explain(proc)
    (job,) = job_dirs(tmp_path)
    record = summary(job)
    assert record["status"] == "ok", record.get("error")
    assert (record["model"], record["devices"]) == ("convnext-digits", 2)
    assert record["global_step"] == 4
    assert set(record["metrics"]) >= {"val/accuracy", "val/loss"}, record["metrics"]


def test_plugins_config_key_loads_a_module_without_entry_point(tmp_path):
    # The package only on the path (no .dist-info): the plugins key names the module.
    env = {"PYTHONPATH": str(PLUGIN_SRC)}
    args = ["model=distilbert-small-cls", SEARCHPATH, *FAST]
    proc = run_train(
        [*args, "plugins=[kiln_plugin_example.models]"], tmp_path, env=env, process=True
    )
    assert proc.returncode == 0, explain(proc)
    record = summary(job_dirs(tmp_path)[0])
    assert (record["status"], record["model"]) == ("ok", "distilbert-small-cls")
    assert record["config"]["plugins"] == ["kiln_plugin_example.models"]


def test_plugin_that_does_not_import_fails_naming_it(tmp_path):
    proc = run_train([*FAST, "plugins=[no_such_plugin_pkg]"], tmp_path)
    assert proc.returncode != 0
    record = summary(job_dirs(tmp_path)[0])
    assert record["status"] == "failed"
    assert "kiln plugin 'no_such_plugin_pkg'" in record["error"], record["error"]


CHECKPOINTS = "trainer.checkpoint_dir=${paths.output_dir}/checkpoints"


@pytest.fixture(scope="module")
def plugin_jobs(installed, tmp_path_factory) -> dict[str, Path]:
    """The installed plugin's models trained by kiln-train with checkpoints: the image model
    in a multirun over two precisions with two worker processes per job, the text model
    in one job. Keys: ``<model>/<precision>``."""
    sweep, text = tmp_path_factory.mktemp("sweep"), tmp_path_factory.mktemp("text")
    args = ["-m", *IMAGE, "trainer.devices=2", "precision=32-true,bf16-mixed", CHECKPOINTS]
    proc = run_train(args, sweep, env=installed, timeout=1800, process=True)
    assert proc.returncode == 0, explain(proc)
    args = ["model=distilbert-small-cls", SEARCHPATH, *FAST, CHECKPOINTS]
    proc = run_train(args, text, env=installed, process=True)
    assert proc.returncode == 0, explain(proc)
    jobs = job_dirs(sweep) + job_dirs(text)
    return {f"{summary(j)['model']}/{summary(j)['precision']}": j for j in jobs}


@pytest.mark.slow
def test_plugin_image_model_sweeps_two_precisions_on_two_devices(plugin_jobs):
    records = [summary(plugin_jobs[f"convnext-digits/{p}"]) for p in ("32-true", "bf16-mixed")]
    assert [r["status"] for r in records] == ["ok", "ok"], [r.get("error") for r in records]
    assert {(r["model"], r["devices"], r["global_step"]) for r in records} == {
        ("convnext-digits", 2, 4)
    }
    assert all(set(r["metrics"]) >= {"val/accuracy", "val/loss"} for r in records), records


@pytest.mark.slow
def test_kiln_export_and_eval_on_plugin_models(installed, plugin_jobs, tmp_path, monkeypatch):
    # Export needs the plugin to rebuild the model; loading the export needs only timm or
    # transformers (a fresh process without the plugin or kiln gets identical outputs).
    monkeypatch.syspath_prepend(installed["PYTHONPATH"].split(os.pathsep)[0])  # the reference
    cases, expected = {}, {}
    for key in ("convnext-digits/32-true", "distilbert-small-cls/32-true"):
        name, job = key.split("/")[0], plugin_jobs[key]
        out = tmp_path / name
        proc = kiln("export", job, out, env=installed, process=True)
        assert proc.returncode == 0, explain(proc)
        module, _ = load_trained_module(resolve_checkpoint(job))
        cases[name], expected[name] = export_case(module, out)
        # 2 validation batches per rank in training (debug=fast): the same samples
        batches = 2 * summary(job)["devices"]
        proc = kiln("eval", job, "--limit-batches", batches, env=installed, process=True)
        assert proc.returncode == 0, explain(proc)
        result = json.loads((job.parent / f"{job.name}-eval" / "eval.json").read_text())
        assert result["wandb"]["run_id"] == summary(job)["wandb"]["run_id"]
        for metric, value in summary(job)["metrics"].items():
            assert result["metrics"][metric] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    got = plain_outputs(cases, tmp_path)
    for name, outputs in expected.items():
        assert torch.equal(got[name], outputs), name


@pytest.mark.slow
@pytest.mark.parametrize("name", ["convnext-digits", "distilbert-small-cls"])
def test_model_test_kit_runs_on_plugin_models(installed, name):
    # The documented command: with the plugin installed, tests/models picks its models up.
    tests = Path(__file__).resolve().parents[1] / "models"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(tests), "-q", "-p", "no:cacheprovider", "-k", name],
        env={**os.environ, **installed},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-6000:]
    passed = int(re.search(r"(\d+) passed", proc.stdout).group(1))
    assert passed >= 4, proc.stdout[-2000:]


def test_local_group_and_a_user_config_folder_join_kilns(tmp_path):
    """configs/local/default.yaml (per machine) applies when present; a user's folder joins
    through hydra.searchpath (both composed as kiln-train composes them)."""
    from hydra import compose, initialize_config_dir

    from kiln.experiments.settings.compose import config_dir
    from kiln.experiments.train.train_config import register_configs

    configs = tmp_path / "configs"
    shutil.copytree(config_dir(), configs)
    assert not (configs / "local").exists()
    register_configs()
    with initialize_config_dir(config_dir=str(configs), version_base="1.3"):
        assert compose("train").trainer.max_steps != 7
    (configs / "local").mkdir()
    (configs / "local" / "default.yaml").write_text(
        "# @package _global_\ntrainer:\n  max_steps: 7\n"
    )
    plugin = f"hydra.searchpath=[file://{PLUGIN_SRC / 'kiln_plugin_example' / 'configs'}]"
    with initialize_config_dir(config_dir=str(configs), version_base="1.3"):
        cfg = compose("train", overrides=[plugin, "model=convnext-digits"])
    assert cfg.trainer.max_steps == 7
    assert cfg.model.name == "convnext-digits"
