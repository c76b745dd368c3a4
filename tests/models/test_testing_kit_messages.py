"""A failure of ``kiln.models.testing`` names the check, the model and what differs: the
logits' shape against the labels', the exported weight that is missing or different."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import kiln.models as km
from kiln.models.registry import _REGISTRY
from kiln.models.testing import KitCheckFailed, check_export, check_forward_backward_and_validation


class ShortLogits(km.ImageClassifier):
    """Its logits lose a row: the loss's batch sizes disagree."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(img_size=16, **kwargs)
        self.model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 10))

    def logits(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values)[:-1]


class ForgetfulExport(ShortLogits):
    """Full logits, and a ``load_export`` that leaves the bias as it was."""

    def logits(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values)

    def export(self, out_dir):
        from pathlib import Path

        Path(out_dir).mkdir(parents=True, exist_ok=True)
        torch.save(self.model.state_dict(), Path(out_dir) / "w.pt")
        return Path(out_dir)

    def load_export(self, out_dir):
        from pathlib import Path

        state = torch.load(Path(out_dir) / "w.pt")
        self.model[1].weight.data.copy_(state["1.weight"])


@pytest.fixture
def registered():
    names = []

    def register(name: str, cls: type) -> str:
        km.register_model(name, task="image-classification", contract=2)(cls)
        names.append(name)
        return name

    yield register
    for name in names:
        _REGISTRY.pop(name, None)


def test_a_shape_mismatch_names_the_check_the_model_and_the_shapes(registered):
    name = registered("short-logits", ShortLogits)
    with pytest.raises(KitCheckFailed) as failed:
        check_forward_backward_and_validation(name)
    message = str(failed.value)
    assert message.startswith("check_forward_backward_and_validation('short-logits'): ")
    assert "training_step(example_batch) raised" in message
    assert "the forward returns" in message and "(3, 10)" in message, message
    assert "labels (4,)" in message, message


def test_an_export_that_loads_a_weight_wrong_names_it(registered, tmp_path):
    name = registered("forgetful-export", ForgetfulExport)
    with pytest.raises(KitCheckFailed) as failed:
        check_export(name, tmp_path)
    message = str(failed.value)
    assert message.startswith("check_export('forgetful-export'): "), message
    assert "different: model.1.bias" in message, message
