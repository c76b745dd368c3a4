import pytest
import torch

import kiln.models as km
from kiln.models.registry import _REGISTRY


def test_registry_holds_the_required_wrappers():
    names = set(km.list_models())
    assert {"minilm-cls", "bert-cls", "bert-tiny-cls", "hf-cls"} <= names
    assert {"gpt2-lm", "gpt2-tiny-lm", "llama-tiny-lm", "hf-lm"} <= names
    assert {"resnet-digits", "resnet-tiny", "vit-tiny", "vit-digits", "timm"} <= names
    assert km.list_models("*-lm") == ["gpt2-lm", "gpt2-tiny-lm", "hf-lm", "llama-tiny-lm"]
    assert km.list_models(task="image-classification") == [
        "resnet-digits",
        "resnet-tiny",
        "timm",
        "vit-digits",
        "vit-tiny",
    ]


def test_unknown_model_lists_the_registered_names():
    with pytest.raises(ValueError) as err:
        km.create_model("bert-tiny")
    message = str(err.value)
    assert "unknown model 'bert-tiny'" in message
    assert "did you mean: bert-tiny-cls" in message
    for name in km.list_models():
        assert name in message


def test_register_a_new_model_in_one_decorated_factory():
    @km.register_model("my-tiny-vit", task="image-classification")
    def my_tiny_vit(**kwargs):
        """A user's model."""
        return km.TimmClassifier(
            arch="vit_tiny_patch16_224",
            img_size=16,
            model_kwargs={"patch_size": 8, "depth": 1, "embed_dim": 16, "num_heads": 1},
            **kwargs,
        )

    try:
        assert "my-tiny-vit" in km.list_models()
        module = km.create_model("my-tiny-vit", num_classes=3)
        out = module.training_step(module.example_batch(2), 0)
        assert out["num_items"] == 2 and torch.isfinite(out["loss"])
        with pytest.raises(ValueError, match="already registered"):
            km.register_model("my-tiny-vit", task="image-classification")(my_tiny_vit)
    finally:
        _REGISTRY.pop("my-tiny-vit", None)
