"""A plugin written for kiln's model contract 1: a timm RegNetX and a transformers ViT.

Contract 1's ``KilnModule`` subclass calls ``self._attach_data()`` at the end of its
``__init__`` and has no ``metric_keys`` or ``tiny_data``; kiln runs it with deprecation
warnings for one release.
"""

from typing import Any

import torch
from transformers import ViTConfig, ViTForImageClassification

from kiln.models import KilnModule, TimmClassifier, register_model
from kiln.models.classification import (
    classification_loss,
    classification_metrics,
    classification_outputs,
)


@register_model("legacy-regnetx-digits", task="image-classification")
def regnetx_digits(**kwargs: Any) -> TimmClassifier:
    """A timm RegNetX-002 for digits at 32x32."""
    return TimmClassifier(**{"arch": "regnetx_002", "img_size": 32, **kwargs})


class HFViT(KilnModule):
    """A transformers ViT on kiln's image data, written for contract 1."""

    task = "image-classification"

    def __init__(self, num_classes: int = 10, width: int = 32, data: Any = None, **kwargs: Any):
        super().__init__(data, **kwargs)
        self.num_classes = num_classes
        self.data_config = {
            "input_size": (3, 32, 32),
            "mean": (0.5, 0.5, 0.5),
            "std": (0.5, 0.5, 0.5),
            "interpolation": "bilinear",
        }
        config = ViTConfig(
            image_size=32, patch_size=8, hidden_size=width, num_hidden_layers=1,
            num_attention_heads=2, intermediate_size=2 * width, num_labels=num_classes,
        )  # fmt: skip
        self.model = ViTForImageClassification(config)
        self._attach_data()

    @property
    def input_size(self) -> tuple[int, int, int]:
        return self.data_config["input_size"]

    def check_input_size(self, input_size: tuple[int, int, int]) -> None:
        if tuple(input_size) != (3, 32, 32):
            raise ValueError(f"HFViT takes 3x32x32 images, not {input_size}")

    def logits(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values).logits

    def loss_and_count(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
        return classification_loss(self.logits(batch["pixel_values"]), batch["labels"])

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict:
        return classification_outputs(self.logits(batch["pixel_values"]), batch["labels"])

    def validation_metrics(self, outputs: dict[str, torch.Tensor]) -> dict[str, float]:
        return classification_metrics(outputs, self.num_classes)

    def example_batch(self, batch_size: int, device: Any = None) -> dict[str, torch.Tensor]:
        pixels = torch.randn(batch_size, 3, 32, 32, generator=torch.Generator().manual_seed(0))
        labels = torch.arange(batch_size) % self.num_classes
        return {"pixel_values": pixels.to(device), "labels": labels.to(device)}


@register_model("legacy-hfvit-digits", task="image-classification")
def hfvit_digits(**kwargs: Any) -> HFViT:
    """A 1-layer, 32-wide transformers ViT at 32x32 for digits."""
    return HFViT(**kwargs)
