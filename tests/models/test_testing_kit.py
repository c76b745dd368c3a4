"""``kiln.models.testing``, the test kit a plugin imports: a model with an export format of
its own passes it through its own ``export``/``load_export``, and ``run_kit(data=...)``
trains on the plugin's data instead of the inherited ``tiny_data()``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import kiln.models as km
from kiln.models.data import ImageClassificationData
from kiln.models.registry import _REGISTRY
from kiln.models.testing import check_export, run_kit, uses_library_export


class PlainCNN(km.ImageClassifier):
    """A plain torch network (neither transformers nor timm) with its own export format."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(img_size=16, **kwargs)
        self.model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(8, self.num_classes),
        )

    def logits(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values)

    def export(self, out_dir: str | Path) -> Path:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        torch.save(self.model.state_dict(), out / "plain_cnn.pt")
        return out

    def load_export(self, out_dir: str | Path) -> None:
        self.model.load_state_dict(torch.load(Path(out_dir) / "plain_cnn.pt"))


@pytest.fixture
def plain_cnn():
    km.register_model("plain-cnn-digits", task="image-classification", contract=2)(PlainCNN)
    yield "plain-cnn-digits"
    _REGISTRY.pop("plain-cnn-digits", None)


def test_a_model_with_its_own_export_format_passes_the_whole_kit(plain_cnn, tmp_path):
    assert not uses_library_export(km.create_model(plain_cnn))
    run_kit(plain_cnn, tmp_path)
    assert (tmp_path / "check_export" / "export" / "plain_cnn.pt").is_file()


def test_the_export_check_fails_a_load_export_that_loads_nothing(plain_cnn, tmp_path, monkeypatch):
    monkeypatch.setattr(PlainCNN, "load_export", lambda self, out_dir: None)
    with pytest.raises(AssertionError):
        check_export(plain_cnn, tmp_path)


def test_run_kit_trains_on_the_data_it_is_given(plain_cnn, tmp_path):
    built = []

    def own_data() -> ImageClassificationData:
        data = ImageClassificationData(batch_size=8, val_batch_size=16, img_size=16)
        built.append(data)
        return data

    run_kit(plain_cnn, tmp_path, data=own_data)
    assert len(built) == 3  # the checkpoint round trip's two models and the fit step's one
    assert all(data.data_config is not None for data in built)  # each attached and used
