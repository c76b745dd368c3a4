"""An installed plugin's config folder joins kiln's Hydra search path by itself, and a
model's own arguments are overridable on the command line without ``+``."""

from __future__ import annotations

import re

import pytest

# The example plugin (tests/plugin_example) installed as users install one: see
# test_plugins.py's ``installed`` fixture (its .dist-info holds the entry point).
from test_plugins import installed  # noqa: F401
from train_helpers import FAST, compose_train, explain, job_dirs, run_train, summary


@pytest.fixture
def on_path(installed, monkeypatch):  # noqa: F811
    """The installed plugin on this process's path (its entry points become visible)."""
    monkeypatch.syspath_prepend(installed["PYTHONPATH"].split(":")[0])


def test_installed_plugin_model_config_composes_without_searchpath(on_path):
    cfg = compose_train(["model=convnext-digits", "data=digits"])
    assert cfg.model.name == "convnext-digits"


def test_model_tiny_and_factory_arguments_override_without_plus():
    cfg = compose_train(["model=bert-tiny-cls", "model.tiny=true", "model.num_labels=3"])
    assert (cfg.model.tiny, cfg.model.num_labels) == (True, 3)
    cfg = compose_train(["model.tiny=true", "model.config_overrides={num_hidden_layers: 1}"])
    assert cfg.model.config_overrides.num_hidden_layers == 1


def test_misspelled_model_argument_fails_before_training_naming_it(tmp_path):
    proc = run_train(["model=resnet-tiny", "data=digits", "model.num_clases=3", *FAST], tmp_path)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert re.search(r"no argument 'num_clases'.*did you mean 'num_classes'", out), out[-2000:]
    (record,) = [summary(d) for d in job_dirs(tmp_path)]
    assert record["error_stage"] in ("config", "setup") and record["global_step"] == 0


def test_a_model_without_config_says_where_kiln_looked_and_how_to_add_one(tmp_path):
    proc = run_train(["model=convnext-digitz", *FAST], tmp_path)
    assert proc.returncode != 0
    assert "Could not find 'model/convnext-digitz'" in proc.stderr, proc.stderr[-2000:]
    assert "configs/model/convnext-digitz.yaml" in proc.stderr, proc.stderr[-2000:]
    assert '[project.entry-points."kiln.plugins"]' in proc.stderr, proc.stderr[-2000:]


def test_kiln_train_trains_an_installed_plugin_model_without_searchpath(installed, tmp_path):  # noqa: F811
    args = ["model=distilbert-small-cls", "model.num_labels=2", *FAST]
    proc = run_train(args, tmp_path, env=installed, process=True)  # its entry point
    assert proc.returncode == 0, explain(proc)
    record = summary(job_dirs(tmp_path)[0])
    assert (record["status"], record["model"]) == ("ok", "distilbert-small-cls")
    assert record["config"]["model"]["tiny"] is True  # debug=fast, no '+' needed
