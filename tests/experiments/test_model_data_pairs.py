"""Every model config with every shipped data config: a pair of one task trains a step; a
pair of two tasks is refused in the config stage, before any W&B run, naming the data
configs that fit the model and the experiments that set both."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from omegaconf import DictConfig
from train_helpers import compose_train, explain, run_train, summary, write_tiny_corpus

from kiln.experiments.settings.compose import config_dir
from kiln.experiments.train.train_config import validate
from kiln.models.registry import get_model_entry

CONFIGS = Path(config_dir())
MODELS = sorted(p.stem for p in (CONFIGS / "model").glob("*.yaml"))
DATA = sorted(p.stem for p in (CONFIGS / "data").glob("*.yaml"))
FITS = {
    "text-classification": {"text"},
    "causal-lm": {"lm_text", "lm_corpus"},
    "masked-lm": {"mlm_text"},
    "question-answering": {"qa"},
    "seq2seq-lm": {"reverse"},
    "token-classification": {"ner"},
    "image-classification": {"digits"},
}
"""The shipped data configs each task trains on."""


def _task(model: str) -> str:
    """The task of the model a ``model=<model>`` config names."""
    return get_model_entry(
        yaml.safe_load((CONFIGS / "model" / f"{model}.yaml").read_text())["name"]
    ).task


@pytest.fixture(scope="module")
def data_nodes() -> dict[str, DictConfig]:
    """The ``data`` node each ``data=<d>`` composes (once for the module)."""
    return {data: compose_train([f"data={data}"]).data for data in DATA}


def test_the_table_names_every_shipped_data_config():
    assert set(DATA) == set().union(*FITS.values())


@pytest.mark.parametrize("model", MODELS)
def test_a_model_with_data_of_another_task_is_refused_in_the_config_stage(model, data_nodes):
    """Compose only: the model's config with each data config's node (what ``data=<d>``
    composes), validated as the config stage validates it."""
    base = compose_train([f"model={model}"])
    base.paths.output_dir = "/tmp/kiln-compose-test"  # ${hydra:...} exists only in a job
    fits = FITS[_task(model)]
    for data in DATA:
        base.data = data_nodes[data]
        if data in fits:
            validate(base)
            continue
        with pytest.raises(ValueError, match="does not train on") as info:
            validate(base)
        message = str(info.value)
        assert "\n" not in message
        for fit in fits:
            assert f"data={fit}" in message, message


def test_kiln_train_refuses_a_causal_lm_on_the_default_classification_text(tmp_path):
    """``kiln-train model=llama-tiny-lm`` (data left at its default): one line naming the
    data configs and the experiments that fit, no W&B run, nothing built."""
    job_dir = tmp_path / "job"
    proc = run_train(["model=llama-tiny-lm", f"hydra.run.dir={job_dir}"], tmp_path)
    assert proc.returncode == 1, explain(proc)
    record = summary(job_dir)
    assert (record["status"], record["error_stage"]) == ("failed", "config"), record["error"]
    error = record["error"]
    assert "model=llama-tiny-lm (causal-lm) does not train on data=text" in error
    for fix in ("data=lm_text", "data=lm_corpus", "experiment=tiny_llama_lm"):
        assert fix in error, error
    assert "AttributeError" not in proc.stdout + proc.stderr
    assert record["wandb"] is None and not (job_dir / "wandb").exists()


PAIRS = [(model, data) for model in MODELS for data in DATA if data in FITS[_task(model)]]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What ``data=lm_corpus`` reads (``KILN_CORPUS``)."""
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.mark.slow
@pytest.mark.parametrize(("model", "data"), PAIRS)
def test_a_model_with_data_of_its_task_trains_a_step(model, data, corpus, tmp_path):
    sizes = (
        ["data.max_train_samples=32", "data.max_val_samples=16"]
        if data == "lm_corpus"
        else ["data.num_train=32", "data.num_val=16"]
        if "num_train" in compose_train([f"data={data}"]).data
        else []
    )
    job_dir = tmp_path / "job"
    proc = run_train(
        [f"model={model}", f"data={data}", *sizes, "debug=fast", "trainer.max_steps=1",
         "data.batch_size=4", "logger=none", f"hydra.run.dir={job_dir}"],
        tmp_path,
        env={"KILN_CORPUS": str(corpus)},
    )  # fmt: skip
    assert proc.returncode == 0, explain(proc)
    record = summary(job_dir)
    assert (record["status"], record["global_step"]) == ("ok", 1), record.get("error")
