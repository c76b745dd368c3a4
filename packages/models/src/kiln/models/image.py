"""``ImageClassifier``: the base of image classifiers, whatever library builds the network.

A subclass builds ``self.model`` and says how pixels become logits (``logits``); the base
does the loss, validation outputs, metrics, synthetic batches and what kiln's image data
needs (:class:`kiln.models.contract.ImageModel`: ``num_classes``, a timm-style
``data_config`` and ``check_input_size``). ``TimmClassifier`` is one; a transformers ViT in
25 lines is another (``docs/model-tasks.md``).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

import torch

from kiln.models.classification import (
    CLASSIFICATION_METRICS,
    classification_loss,
    classification_metrics,
    classification_outputs,
)
from kiln.models.module import KilnModule
from kiln.models.optim import OptimizerConfig, SchedulerConfig

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ImageClassifier(KilnModule):
    """Image classification: batches of ``pixel_values`` (B, C, H, W) and ``labels`` (B,).

    Args:
        num_classes: Classes; ``None`` takes them from the data (1000 without data).
        img_size: Input height and width the data is transformed to.
        in_chans: Input channels (grayscale data is replicated to match).
        mean, std: Per-channel normalization of the transforms.
        interpolation: Resize interpolation of the transforms (``bilinear``, ``bicubic``).
        data, optimizer, scheduler: See ``KilnModule``.
    """

    task = "image-classification"
    metric_keys = CLASSIFICATION_METRICS

    def __init__(
        self,
        num_classes: int | None = None,
        img_size: int = 224,
        in_chans: int = 3,
        mean: tuple[float, ...] = IMAGENET_MEAN,
        std: tuple[float, ...] = IMAGENET_STD,
        interpolation: str = "bilinear",
        data: Any = None,
        optimizer: OptimizerConfig | None = None,
        scheduler: SchedulerConfig | None = None,
    ) -> None:
        super().__init__(data, optimizer, scheduler)
        if num_classes is None:
            num_classes = data.num_labels if data is not None else 1000
        if num_classes < 1:
            raise ValueError(f"num_classes={num_classes!r} must be >= 1")
        self.num_classes = num_classes
        self.data_config: dict[str, Any] = {
            "input_size": (in_chans, img_size, img_size),
            "mean": tuple(mean),
            "std": tuple(std),
            "interpolation": interpolation,
        }

    @abstractmethod
    def logits(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Class logits (B, num_classes) of a batch of images."""

    @classmethod
    def tiny_data(cls) -> Any:
        from kiln.models.data import ImageClassificationData

        return ImageClassificationData(batch_size=16, val_batch_size=32)

    @property
    def input_size(self) -> tuple[int, int, int]:
        """(channels, height, width) the model takes and the data is transformed to."""
        return tuple(self.data_config["input_size"])

    def check_input_size(self, input_size: tuple[int, int, int]) -> None:
        """Run one dummy image through the model now, so a bad size fails before training."""
        was_training = self.training
        self.eval()
        try:
            with torch.no_grad():
                self.logits(torch.zeros(1, *input_size))
        except Exception as err:  # timm raises AssertionError, HF ValueError...
            raise ValueError(
                f"{self._describe()} cannot take images of size {tuple(input_size)} "
                f"(channels, height, width): {err}. Pass img_size= the model supports (ViTs "
                "take it at construction; the patch size must divide it)"
            ) from err
        finally:
            self.train(was_training)

    def _describe(self) -> str:
        return type(self).__name__

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.logits(pixel_values)

    def model_inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"pixel_values": batch["pixel_values"]}

    def loss_and_count(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
        return classification_loss(self.logits(batch["pixel_values"]), batch["labels"])

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict:
        return classification_outputs(self.logits(batch["pixel_values"]), batch["labels"])

    def validation_metrics(self, outputs: dict[str, torch.Tensor]) -> dict[str, float]:
        return classification_metrics(outputs, self.num_classes)

    def example_batch(self, batch_size: int, device: Any = None) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(0)
        pixels = torch.randn(batch_size, *self.input_size, generator=generator)
        labels = torch.arange(batch_size) % self.num_classes
        return {"pixel_values": pixels.to(device), "labels": labels.to(device)}
