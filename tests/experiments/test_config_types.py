"""Every key of the groups without a schema of their own (``data``, ``callbacks``, ``model``)
is checked in the config stage against the annotations of what reads it: a wrong type is
refused naming the key, the value and what is allowed, before any W&B run; every argument
a shipped config's target takes is settable without ``+``. Settings a run takes but cannot
honour warn there, one line each."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from train_helpers import FAST, compose_train, explain, refused_in_config, run_train

from kiln.experiments.settings.compose import config_dir
from kiln.experiments.train.train_config import validate

CONFIGS = Path(config_dir())
LM = ["model=llama-tiny-lm", "data=lm_text", "data.num_train=64", "data.num_val=16"]


def _validated(overrides: list[str]):
    cfg = compose_train(overrides)
    cfg.paths.output_dir = "/tmp/kiln-compose-test"  # ${hydra:...} exists only in a job
    return validate(cfg)


def _refused(args: list[str], tmp_path: Path, *errors: str) -> dict:
    """``kiln-train args`` ends in the config stage, naming ``errors`` in one line, with no
    W&B run."""
    record, _ = refused_in_config(args, tmp_path, *errors)
    assert "Traceback" not in record["error"] and "\n" not in record["error"]
    return record


@pytest.mark.parametrize("value", ["no", "'false'", "yes"])
def test_a_string_where_a_boolean_belongs_is_refused_not_read_as_true(value, tmp_path):
    shown = value.strip("'")
    _refused([*LM, f"data.packing={value}"], tmp_path, f"data.packing='{shown}'", "true or false")


def test_a_string_where_an_integer_belongs_is_refused_naming_the_key(tmp_path):
    _refused([*LM, "data.shuffle_buffer=abc"], tmp_path, "data.shuffle_buffer='abc'", "an integer")


def test_callbacks_and_model_keys_are_checked_too(tmp_path):
    _refused(
        ["callbacks=ema", "callbacks.ema.validate_with_ema=no"],
        tmp_path,
        "callbacks.ema.validate_with_ema='no'",
        "true or false",
    )
    with pytest.raises(ValueError, match=r"callbacks.ema.decay='abc' is not valid: use a number"):
        _validated(["callbacks=ema", "callbacks.ema.decay=abc"])
    with pytest.raises(ValueError, match=r"model.tiny='yes' is not valid: use true or false"):
        _validated(["model=bert-tiny-cls", "model.tiny=yes"])
    with pytest.raises(ValueError, match=r"model.img_size='abc' is not valid: use an integer"):
        _validated(["model=resnet-tiny", "data=digits", "model.img_size=abc"])
    with pytest.raises(ValueError, match=r"data.buckets=\['a'\] is not valid: use a list"):
        _validated(["data.buckets=[a]"])


def test_a_key_added_with_plus_that_the_target_does_not_take_is_refused(tmp_path):
    _refused(
        ["+data.max_lenght=8"],
        tmp_path,
        "data.max_lenght is not an argument of TextClassificationData",
        "did you mean data.max_length",
    )
    with pytest.raises(ValueError, match=r"model 'resnet-tiny' has no argument 'foo'"):
        _validated(["model=resnet-tiny", "data=digits", "+model.foo=1"])
    with pytest.raises(ValueError, match=r"model 'llama-tiny-lm' fixes arch='llama'"):
        _validated([*LM, "model.arch=gpt2"])


def test_values_of_the_right_type_pass_as_given():
    data = _validated(
        [*LM, "data.packing=false", "data.shuffle_buffer=8", "data.val_fraction=0"]
    ).data
    assert (data["packing"], data["shuffle_buffer"], data["val_fraction"]) == (False, 8, 0)
    ner = _validated(["model=bert-tiny-token-cls", "data=ner", "data.tag_names=[O,B-PER]"])
    assert ner.data["tag_names"] == ["O", "B-PER"]  # no '+': the docs' spelling works


def _targets() -> list[Path]:
    files = [*(CONFIGS / "data").glob("*.yaml"), *(CONFIGS / "callbacks").glob("*.yaml")]
    return sorted(files)


@pytest.mark.parametrize("path", _targets(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_shipped_config_lists_every_argument_its_target_takes(path):
    """So each is settable on the command line without ``+`` (``data.tag_names=[...]``)."""
    from hydra.utils import get_object

    from kiln.models.registry import call_parameters

    loaded = yaml.safe_load(path.read_text()) or {}
    nodes = [loaded] if "_target_" in loaded else list(loaded.values())
    for node in nodes:
        params, _ = call_parameters(get_object(node["_target_"]))
        missing = sorted(set(params) - set(node))
        assert not missing, f"{path.name} lacks {missing} of {node['_target_']}"
        extra = sorted(k for k in set(node) - set(params) if k != "_target_")
        assert not extra, f"{path.name} sets {extra}, which {node['_target_']} does not take"


def test_streaming_with_max_epochs_and_packing_with_flash_attention_fail_in_the_config_stage(
    tmp_path,
):
    _refused(
        [*LM, "data.streaming=true", "trainer.max_epochs=1"],
        tmp_path,
        "trainer.max_epochs=1 cannot end a run on a stream",
    )
    with pytest.raises(ValueError, match=r"data.packing=true needs attention that takes a 4-D"):
        _validated([*LM, "data.packing=true", "model.attn_implementation=flash_attention_2"])


def test_settings_a_run_cannot_honour_warn_in_the_config_stage(tmp_path):
    """More threads than cores, a step-time warm-up as long as the run, a profile longer than
    it: the job trains, and says so before its first step, one line each."""
    from kiln.core.telemetry.machine import usable_cores

    threads = usable_cores() + 1
    job_dir = tmp_path / "job"
    proc = run_train(
        [*FAST, "logger=none", f"trainer.threads_per_rank={threads}",
         "trainer.warmup_steps=100", "profile=steps", f"hydra.run.dir={job_dir}"],
        tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, explain(proc)
    out = proc.stdout + proc.stderr
    for said in (
        f"trainer.threads_per_rank={threads}: {threads} threads",
        "trainer.warmup_steps=100 is not fewer than trainer.max_steps=4",
        "profile=steps needs 7 steps",
    ):
        lines = [line for line in out.splitlines() if said in line]
        assert len(lines) == 1, (said, out[-3000:])


@pytest.mark.parametrize("contract", [0, -1])
def test_a_contract_number_below_one_is_refused_as_no_version(contract):
    from kiln.models import register_model

    with pytest.raises(ValueError) as info:
        register_model("not-registered", task="text-classification", contract=contract)(
            lambda: None
        )
    message = str(info.value)
    assert f"contract={contract} is not a contract version" in message
    assert "Migrate" not in message and "from contract" not in message
