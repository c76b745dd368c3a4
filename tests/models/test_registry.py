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


def test_every_registered_model_has_a_tiny_variant_of_itself():
    for name in km.list_models():
        entry = km.get_model_entry(name)
        assert isinstance(entry.tiny, dict), name
        module = km.create_model(name, tiny=True)
        assert sum(p.numel() for p in module.parameters()) < 2_000_000, name


def test_tiny_shrinks_the_configured_architecture_and_keeps_other_arguments():
    module = km.create_model(
        "hf-lm",
        arch="llama",
        tiny=True,
        config_overrides={"hidden_size": 512, "rms_norm_eps": 1e-3},
    )
    config = module.model.config
    assert config.model_type == "llama" and config.hidden_size == 32  # tiny wins on size
    assert config.rms_norm_eps == 1e-3
    vit = km.create_model("timm", arch="vit_tiny_patch16_224", num_classes=3, tiny=True)
    assert vit.arch == "vit_tiny_patch16_224" and vit.num_classes == 3
    with pytest.raises(ValueError, match=r"model 'timm' has no tiny variant.*densenet121"):
        km.create_model("timm", arch="densenet121", tiny=True)
    with pytest.raises(ValueError, match=r"model 'hf-lm' has no tiny variant.*'mistral'"):
        km.create_model("hf-lm", arch="mistral", tiny=True)


def test_misspelled_model_arguments_fail_naming_the_valid_ones():
    with pytest.raises(ValueError) as err:
        km.create_model("bert-tiny-cls", config_overides={"num_hidden_layers": 1})
    message = str(err.value)
    assert "'config_overides'" in message and "did you mean 'config_overrides'" in message
    assert "pretrained" in message and "num_labels" in message
    with pytest.raises(
        ValueError,
        match=r"config_overrides.num_hiden_layers is not a field.*"
        r"did you mean 'num_hidden_layers'",
    ):
        km.create_model("bert-tiny-cls", config_overrides={"num_hiden_layers": 1})
    with pytest.raises(ValueError) as err:
        km.create_model("resnet-tiny", num_clases=3)
    message = str(err.value)
    assert "model 'resnet-tiny' has no argument 'num_clases'" in message
    assert "did you mean 'num_classes'" in message and "img_size" in message
    # HF config fields are still accepted directly, and in config_overrides
    module = km.create_model("bert-tiny-cls", hidden_dropout_prob=0.2)
    assert module.model.config.hidden_dropout_prob == 0.2


def test_an_alias_is_its_base_with_arguments_set():
    km.register_alias(
        "my-tiny-resnet",
        "timm",
        "A user's alias.",
        fixed={"arch": "resnet18"},
        defaults={"img_size": 16, "model_kwargs": {"layers": [1, 1, 1, 1], "channels": [4] * 4}},
    )
    try:
        entry = km.get_model_entry("my-tiny-resnet")
        assert entry.task == "image-classification" and entry.description == "A user's alias."
        # the caller's dict is merged over the default one; its other defaults stay
        module = km.create_model(
            "my-tiny-resnet", num_classes=3, model_kwargs={"channels": [8] * 4}
        )
        assert module.arch == "resnet18" and module.input_size == (3, 16, 16)
        assert module.model.fc.in_features == 8 and len(module.model.layer1) == 1
        with pytest.raises(ValueError, match=r"'my-tiny-resnet' fixes arch='resnet18'.*'timm'"):
            km.create_model("my-tiny-resnet", arch="resnet50")
    finally:
        _REGISTRY.pop("my-tiny-resnet", None)
