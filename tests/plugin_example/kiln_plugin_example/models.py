"""The plugin's models: one factory each, registered when kiln loads the entry point."""

from typing import Any

from kiln.models import HFSequenceClassifier, TimmClassifier, register_model

DISTILBERT_SMALL = {"dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64}


@register_model(
    "convnext-digits",
    task="image-classification",
    tiny={"model_kwargs": {"depths": [1, 1, 1, 1], "dims": [8, 16, 32, 64]}},
)
def convnext_digits(**kwargs: Any) -> TimmClassifier:
    """A timm ConvNeXt-atto for digits upscaled to 32x32, from scratch."""
    return TimmClassifier(**{"arch": "convnext_atto", "img_size": 32, **kwargs})


@register_model("distilbert-small-cls", task="text-classification", tiny={})
def distilbert_small_cls(**kwargs: Any) -> HFSequenceClassifier:
    """A 2-layer, 32-wide DistilBERT classifier built from its config (random init)."""
    defaults = {"arch": "distilbert", "pretrained": None, "config_overrides": DISTILBERT_SMALL}
    return HFSequenceClassifier(**{**defaults, **kwargs})
