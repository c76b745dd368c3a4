"""Every config group option and experiment composes, validates and instantiates; bad
overrides fail at compose time and say what is valid."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException
from train_helpers import compose_train, explain, run_train, write_tiny_corpus

from kiln.experiments.settings.build import build_module
from kiln.experiments.settings.compose import config_dir
from kiln.experiments.train.train_config import TrainConfig, validate
from kiln.models.registry import get_model_entry

CONFIGS = Path(config_dir())


@pytest.fixture(scope="module", autouse=True)
def corpus(tmp_path_factory: pytest.TempPathFactory):
    """A small corpus where ``data=lm_corpus`` looks (a user writes it with make_corpus.py)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KILN_CORPUS", str(write_tiny_corpus(tmp_path_factory.mktemp("corpus"))))
        yield


# Groups whose options are whole configs this test composes one by one (hydra/paths are fixed).
GROUPS = (
    "model",
    "data",
    "trainer",
    "precision",
    "compile",
    "optimizer",
    "scheduler",
    "callbacks",
    "logger",
    "launcher",
    "experiment",
    "sweep",
    "hparams_search",
    "debug",
)
# Files in configs/ that belong to kiln-bench (tested with it).
NOT_TRAIN = {"bench.yaml"}
DATA_FOR_TASK = {
    "text-classification": "text",
    "causal-lm": "lm_text",
    "image-classification": "digits",
    "masked-lm": "mlm_text",
    "question-answering": "qa",
    "seq2seq-lm": "reverse",
    "token-classification": "ner",
}

MODEL_FOR_DATA = {
    "digits": "resnet-tiny",
    "lm_corpus": "llama-tiny-lm",
    "lm_text": "gpt2-tiny-lm",
    "mlm_text": "bert-tiny-mlm",
    "ner": "bert-tiny-token-cls",
    "qa": "bert-tiny-qa",
    "reverse": "t5-tiny-seq2seq",
    "text": "minilm-cls",
}


def options(group: str) -> list[str]:
    return sorted(
        p.stem
        for p in (CONFIGS / group).glob("*.yaml")
        if not (group == "sweep" and p.stem.startswith(("bench", "pt2")))
    )


def validated(overrides: list[str]) -> TrainConfig:
    """The job's config as kiln-train builds its model from it: composed and validated."""
    return validate(_without_hydra(compose_train(overrides)))


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_of_every_group_composes_and_validates(group):
    assert options(group), f"configs/{group}/ is empty"
    for option in options(group):
        overrides = [f"{group}={option}"]
        if group == "model":  # with data it trains on (another task's is refused)
            name = compose_train(overrides).model.name
            overrides.append(f"data={DATA_FOR_TASK[get_model_entry(name).task]}")
        if group == "data":
            overrides.append(f"model={MODEL_FOR_DATA[option]}")
        cfg = compose_train(overrides)
        settings = validate(_without_hydra(cfg))
        assert isinstance(settings, TrainConfig)


def _without_hydra(cfg):
    # paths.output_dir interpolates ${hydra:...}, which exists only inside a job
    cfg.paths.output_dir = "/tmp/kiln-compose-test"
    return cfg


def test_default_run_is_pretrained_minilm_on_generated_text_cpu_wandb_offline():
    cfg = compose_train([])
    assert cfg.model.name == "minilm-cls"
    assert cfg.data._target_.endswith("TextClassificationData")
    assert cfg.trainer.accelerator == "cpu" and cfg.trainer.devices == 1
    assert cfg.trainer.progress is True
    assert cfg.logger.backend == "wandb" and cfg.logger.mode == "offline"
    assert cfg.compile.mode == "none" and cfg.trainer.precision == "32-true"


@pytest.mark.parametrize("model", options("model"))
def test_every_model_config_instantiates_with_its_data(model):
    name = compose_train([f"model={model}"]).model.name
    data = DATA_FOR_TASK[get_model_entry(name).task]
    if model == "bert-cls":
        pytest.skip("BERT-base from its config: covered by kiln.models' registry tests")
    cfg = validated([f"model={model}", f"data={data}", "data.batch_size=4"])
    module = build_module(cfg)
    assert sum(p.numel() for p in module.parameters()) > 0
    # the data feeds the model what it takes: every input it expects, at its shape and
    # dtype, in batches of data.batch_size
    batch = next(iter(module.train_dataloader()))
    expected = module.example_batch(cfg.data["batch_size"])
    assert set(expected) <= set(batch), (sorted(expected), sorted(batch))
    for key, value in expected.items():
        assert (batch[key].shape, batch[key].dtype) == (value.shape, value.dtype), key


@pytest.mark.parametrize("experiment", options("experiment"))
def test_every_experiment_instantiates_its_tiny_debug_variant(experiment):
    full = compose_train([f"experiment={experiment}"])
    assert full.name == experiment
    cfg = validated([f"experiment={experiment}", "debug=fast"])
    assert cfg.model["name"] == full.model.name and cfg.model["tiny"] is True
    module = build_module(cfg)
    batch = next(iter(module.train_dataloader()))
    out = module.training_step(batch, 0)
    assert out["loss"].isfinite()


@pytest.mark.parametrize("model", options("model"))
def test_debug_fast_shrinks_the_chosen_model_not_another_one(model):
    name = compose_train([f"model={model}"]).model.name
    data = DATA_FOR_TASK[get_model_entry(name).task]
    cfg = validated([f"model={model}", f"data={data}", "debug=fast"])
    assert cfg.model["name"] == name  # the model asked for, not a stand-in
    module = build_module(cfg)
    assert sum(p.numel() for p in module.parameters()) < 2_000_000  # test-sized
    out = module.training_step(next(iter(module.train_dataloader())), 0)
    assert out["loss"].isfinite()


def test_sweep_files_set_the_sweeper_params():
    cfg = compose_train(["sweep=precision_compile"], hydra_config=True)
    params = cfg.hydra.sweeper.params
    assert params["precision"] == "32-true,bf16-mixed"
    assert params["compile"] == "none,default,max-autotune"
    assert cfg.hydra.mode.name == "MULTIRUN"


def test_slurm_launcher_maps_nodes_and_devices_to_tasks():
    cfg = compose_train(
        ["launcher=slurm", "trainer.num_nodes=2", "trainer.devices=4"], hydra_config=True
    )
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.kiln_slurm_launcher.KilnSlurmLauncher"
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (2, 4, 4)


def test_unknown_group_option_fails_and_lists_the_valid_ones():
    with pytest.raises(MissingConfigException) as info:
        compose_train(["precision=bf16"])
    message = str(info.value)
    assert "precision/bf16" in message
    assert "bf16-mixed" in message and "32-true" in message


def test_wrong_type_and_unknown_key_fail_at_compose_time():
    with pytest.raises(ConfigCompositionException) as info:
        compose_train(["trainer.max_steps=abc"])
    assert "trainer.max_steps" in str(info.value)
    assert "could not be converted to Integer" in str(info.value.__cause__)
    with pytest.raises(ConfigCompositionException) as info:
        compose_train(["trainer.max_stepz=3"])
    assert "trainer.max_stepz" in str(info.value)


def test_out_of_range_value_fails_validation_naming_the_key():
    cfg = _without_hydra(compose_train(["trainer.max_steps=0"]))
    with pytest.raises(ValueError, match=r"trainer.max_steps=0 is not valid"):
        validate(cfg)
    cfg = _without_hydra(compose_train(["compile.mode=fast"]))
    with pytest.raises(ValueError, match=r"compile.mode='fast' is not valid; choose one of"):
        validate(cfg)


def test_bad_override_on_the_command_line_fails_fast(tmp_path):
    proc = run_train(["precision=fp8"], tmp_path, timeout=120)
    assert proc.returncode != 0, explain(proc)
    assert "Could not find 'precision/fp8'" in proc.stderr
    assert "bf16-mixed" in proc.stderr  # the valid options are listed
    assert not (tmp_path / "runs").exists()  # nothing ran


def test_jobs_share_one_inductor_cache_below_the_log_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_LOG_DIR", str(tmp_path))
    for compile_mode in ("default", "max-autotune"):
        cfg = compose_train([f"compile={compile_mode}"])
        assert cfg.compile.cache_dir == f"{tmp_path}/inductor_cache"
        assert validate(_without_hydra(cfg)).compile.cache_dir == f"{tmp_path}/inductor_cache"
    assert compose_train(["compile.cache_dir=null"]).compile.cache_dir is None


def test_the_trainer_group_lists_only_deliberate_overrides_each_with_its_reason():
    """TrainerConfig holds every default; configs/trainer/default.yaml only what a kiln-train
    job sets otherwise, each key under a comment that says why."""
    import dataclasses

    from omegaconf import OmegaConf

    from kiln.core import TrainerConfig

    path = Path(config_dir()) / "trainer" / "default.yaml"
    lines = path.read_text().splitlines()
    listed = OmegaConf.to_container(OmegaConf.load(path))
    defaults = {f.name: getattr(TrainerConfig(), f.name) for f in dataclasses.fields(TrainerConfig)}
    for key, value in listed.items():
        assert key in defaults, f"{path}: {key} is not a TrainerConfig field"
        assert value != defaults[key], f"{path}: {key}={value!r} is TrainerConfig's default"
        at = next(i for i, line in enumerate(lines) if line.startswith(f"{key}:"))
        above = next(line for line in reversed(lines[:at]) if line.split(":")[0] not in listed)
        assert above.startswith("#"), f"{path}: {key} has no comment saying why"
    # and what a job runs is the dataclass's default for every other key
    composed = OmegaConf.to_container(compose_train([]).trainer, resolve=False)
    for key, value in defaults.items():
        if key not in listed:
            expected = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
            assert composed[key] == expected, key
