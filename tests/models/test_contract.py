"""The model contract is a checked interface: what a model lacks fails at ``create_model``
(or construction), naming it, not as an AttributeError in the middle of a run."""

from __future__ import annotations

import lightning as L
import pytest
import torch

import kiln.models as km
from kiln.models.contract import ContractDeprecationWarning
from kiln.models.data import ImageClassificationData
from kiln.models.registry import _REGISTRY


@pytest.fixture
def registered():
    names = []

    def register(name, factory, task="image-classification", contract=None):
        km.register_model(name, task=task, contract=contract)(factory)
        names.append(name)

    yield register
    for name in names:
        _REGISTRY.pop(name, None)


class Half(km.KilnModule):
    """Implements two of the four methods."""

    task = "image-classification"
    metric_keys = ("loss",)

    def loss_and_count(self, batch):
        return torch.zeros(()), 1

    def validation_step(self, batch, batch_idx):
        return {}


def test_a_kiln_module_missing_methods_fails_at_construction_naming_them(registered):
    registered("half-model", lambda **kw: Half(**kw))
    with pytest.raises(
        TypeError, match=r"Half does not implement validation_metrics, example_batch"
    ):
        km.create_model("half-model")


def test_a_factory_returning_something_else_fails_naming_what_it_lacks(registered):
    registered("plain-lightning", lambda **kw: L.LightningModule())
    with pytest.raises(TypeError) as err:
        km.create_model("plain-lightning")
    message = str(err.value)
    assert "model 'plain-lightning' (LightningModule) does not implement" in message
    for member in ("example_batch", "loss_and_count", "metric_keys", "task", "validation_metrics"):
        assert member in message
    assert "docs/model-tasks.md" in message


class NoKeys(Half):
    metric_keys = ()

    def validation_metrics(self, outputs):
        return {}

    def example_batch(self, batch_size, device=None):
        return {}


def test_empty_metric_keys_fail_saying_what_they_are(registered):
    registered("no-keys", lambda **kw: NoKeys(**kw), contract=2)
    with pytest.raises(TypeError, match=r"metric_keys=\(\) must be a non-empty tuple"):
        km.create_model("no-keys")


def test_empty_metric_keys_of_an_undeclared_contract_warn_and_build(registered):
    registered("no-keys-undeclared", lambda **kw: NoKeys(**kw))
    with pytest.warns(ContractDeprecationWarning, match=r"set the class attribute metric_keys"):
        km.create_model("no-keys-undeclared")


def test_image_data_asks_the_model_for_what_it_needs_by_name(registered):
    registered("no-image-config", _keys_model)
    with pytest.raises(TypeError) as err:
        km.create_model("no-image-config", data=ImageClassificationData())
    message = str(err.value)
    assert "ImageClassificationData needs the model to provide" in message
    assert "check_input_size, data_config, num_classes" in message and "ImageModel" in message


def _keys_model(**kwargs):
    class Keys(NoKeys):
        metric_keys = ("loss",)

    return Keys(**kwargs)


def test_export_without_a_transformers_or_timm_model_says_to_implement_it(tmp_path):
    with pytest.raises(NotImplementedError, match=r"implement export\(out_dir\) and load_export"):
        _keys_model().export(tmp_path)
