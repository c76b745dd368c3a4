"""kiln's model contract has a version: a plugin written for the previous one (contract 1,
``tests/models/legacy_plugin``) trains with a warning naming each fix, and a plugin declaring
a version this kiln does not run is refused when it registers, saying what to change."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

import kiln.models as km
from kiln.core import TrainerConfig, fit
from kiln.models import plugins
from kiln.models.contract import CONTRACT_VERSION, ContractDeprecationWarning
from kiln.models.data import ImageClassificationData
from kiln.models.registry import _REGISTRY

LEGACY = Path(__file__).resolve().parent / "legacy_plugin"
MODULE = "legacy_kiln_plugin.models"


@pytest.fixture
def legacy(monkeypatch):
    """The contract-1 plugin on the path, loaded as ``plugins=[legacy_kiln_plugin.models]``
    loads it; unregistered afterwards."""
    monkeypatch.syspath_prepend(str(LEGACY))
    before = set(_REGISTRY)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert plugins.load_plugins([MODULE]) == [MODULE]
    yield caught
    for name in set(_REGISTRY) - before:
        del _REGISTRY[name]
    plugins._loaded.discard(MODULE)
    for name in [m for m in sys.modules if m.startswith("legacy_kiln_plugin")]:
        del sys.modules[name]


def test_the_contract_states_its_version():
    assert CONTRACT_VERSION == 2
    assert issubclass(ContractDeprecationWarning, DeprecationWarning)


def test_a_previous_release_plugin_trains_warning_what_to_change(legacy):
    data = ImageClassificationData(batch_size=16, val_batch_size=32)
    with pytest.warns(ContractDeprecationWarning) as record:
        module = km.create_model("legacy-hfvit-digits", data=data)
        result = fit(module, TrainerConfig(max_steps=2, accelerator="cpu", progress=False,
                                           limit_val_batches=1))  # fmt: skip
    assert result.global_step == 2 and 0.0 <= result.metrics["val/accuracy"] <= 1.0
    messages = "\n".join(str(w.message) for w in record)
    assert "HFViT.__init__ relies on '_attach_data' of kiln's model contract 1" in messages
    assert "delete the self._attach_data() call at the end of __init__" in messages
    assert "model 'legacy-hfvit-digits' (HFViT) relies on 'metric_keys'" in messages
    assert "set the class attribute metric_keys to the keys validation_metrics returns" in messages
    assert "docs/extending.md#migrating-from-the-previous-release" in messages
    assert module.data_module.data_config["input_size"] == (3, 32, 32)  # attached, once


def test_the_previous_release_plugin_s_timm_model_builds_without_a_warning(legacy):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ContractDeprecationWarning)
        module = km.create_model("legacy-regnetx-digits")
    assert module.metric_keys == ("accuracy", "f1", "loss")


def _register(name: str, contract: int):
    km.register_model(name, task="image-classification", contract=contract)(lambda **kw: None)


def test_declaring_contract_1_warns_at_registration_with_the_migration():
    try:
        with pytest.warns(ContractDeprecationWarning) as record:
            _register("declares-contract-1", 1)
    finally:
        _REGISTRY.pop("declares-contract-1", None)
    (warning,) = record
    message = str(warning.message)
    assert "model 'declares-contract-1' is registered for kiln's model contract 1" in message
    assert "register it with contract=2" in message
    for fix in ("self._attach_data()", "metric_keys", "tiny_data()"):
        assert fix in message


@pytest.mark.parametrize(
    ("contract", "fix"),
    [
        (3, "the installed kiln-models implements contract 2 (supports 1, 2): upgrade kiln-models"),
        (0, "contract=0 is not a contract version: it must be an int >= 1"),
        ("2", "contract='2' is not a contract version: it must be an int >= 1"),
    ],
)
def test_an_unsupported_contract_is_refused_at_registration_saying_what_to_do(contract, fix):
    with pytest.raises(ValueError) as err:
        _register("declares-other", contract)  # type: ignore[arg-type]
    assert fix in str(err.value)
    assert "declares-other" not in _REGISTRY
