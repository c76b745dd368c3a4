"""What every classifier shares (HF sequence and timm image): loss, per-sample outputs, metrics."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kiln.models.data.base import IGNORE_INDEX
from kiln.models.metrics import load_metric
from kiln.models.module import at_least_fp32

CLASSIFICATION_METRICS = ("accuracy", "f1", "loss")
"""The keys of :func:`classification_metrics`."""


def classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The mean cross-entropy of a training batch and its item count (the samples)."""
    return F.cross_entropy(at_least_fp32(logits), labels), labels.shape[0]


def classification_outputs(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-sample validation outputs of a classifier: predictions, labels and losses."""
    logits = at_least_fp32(logits)
    loss = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="none")
    return {"preds": logits.argmax(-1), "labels": labels, "loss": loss}


def classification_metrics(outputs: dict[str, torch.Tensor], num_labels: int) -> dict[str, float]:
    """Accuracy, F1 (binary, or macro over classes) and mean loss of the real rows."""
    keep = outputs["labels"] != IGNORE_INDEX  # drops the validation padding rows
    preds = outputs["preds"][keep].cpu().numpy()
    labels = outputs["labels"][keep].cpu().numpy()
    average = "binary" if num_labels == 2 else "macro"
    accuracy = load_metric("accuracy").compute(predictions=preds, references=labels)
    f1 = load_metric("f1").compute(predictions=preds, references=labels, average=average)
    return {
        "accuracy": accuracy["accuracy"],
        "f1": f1["f1"],
        "loss": float(at_least_fp32(outputs["loss"][keep]).mean()),
    }
