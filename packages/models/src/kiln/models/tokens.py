"""Token-weighted losses and metrics, shared by the wrappers whose items are tokens
(causal, masked and sequence-to-sequence LMs, token classification).

A batch's loss is the sum of its counted tokens' losses over their number, and its item
count is that number: kiln.core's accumulation then weights micro-batches by tokens, so a
window equals one big batch however the counted tokens fall.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kiln.models.data.base import IGNORE_INDEX
from kiln.models.data.packing import PAD_DOCUMENT
from kiln.models.metrics import load_metric
from kiln.models.module import at_least_fp32


def token_nll(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token NLL of ``logits`` (B, L, V) at ``labels`` (B, L), 0 where a label is -100,
    and the mask of counted tokens."""
    # (B*L, V) rows, not (B, V, L): on the CPU a log-softmax over a transposed (or sliced)
    # class dim copies the logits and runs several times slower, backward included
    flat = at_least_fp32(logits).reshape(-1, logits.shape[-1])
    nll = F.cross_entropy(flat, labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none")
    return nll.view(labels.shape), labels != IGNORE_INDEX


def next_token_nll(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`token_nll` of a causal LM: ``logits`` (B, L, V) at position i predict
    ``labels`` at i + 1. Both (B, L - 1).

    The labels shift, not the logits: slicing the logits would copy them (and their
    gradient) once more, a large share of a small model's step on the CPU.
    """
    shifted = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)
    nll, counted = token_nll(logits, shifted)
    return nll[:, :-1], counted[:, :-1]


def mean_token_loss(nll: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean over counted tokens and their count (a batch of padding is 0, not NaN)."""
    count = mask.sum()
    return nll.sum() / count.clamp(min=1), count


def count_tokens(labels: torch.Tensor) -> torch.Tensor:
    """Counted (not -100) label tokens: ``count_items`` of a token-weighted batch."""
    return (labels != IGNORE_INDEX).sum()


def count_padding(batch: dict[str, torch.Tensor]) -> tuple[int, int]:
    """(padding positions, all positions) of a host batch of rows: padding is where
    ``document_ids`` is -1 (packed rows) or ``attention_mask`` is 0 (one document a row)."""
    ids = batch["input_ids"]
    if "document_ids" in batch:
        padding = int((batch["document_ids"] == PAD_DOCUMENT).sum())
    elif "attention_mask" in batch:
        padding = int((batch["attention_mask"] == 0).sum())
    else:
        padding = 0
    return padding, ids.numel()


def token_outputs(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-sample validation outputs: argmax predictions and labels (B, L), and each
    sample's summed NLL and counted tokens (B,)."""
    nll, mask = token_nll(logits, labels)
    return {
        "preds": logits.argmax(-1),
        "labels": labels,
        "nll_sum": nll.sum(1),
        "tokens": mask.sum(1),
    }


def perplexity(outputs: dict[str, torch.Tensor]) -> dict[str, float]:
    """Token-weighted perplexity and mean loss of the whole set (``perplexity`` module)."""
    return load_metric("perplexity").compute(
        nll_sums=outputs["nll_sum"].detach().double().cpu().numpy(),
        token_counts=outputs["tokens"].cpu().numpy(),
    )


def token_accuracy(outputs: dict[str, torch.Tensor]) -> float:
    """The share of counted tokens predicted right (``accuracy`` module)."""
    keep = outputs["labels"] != IGNORE_INDEX
    return load_metric("accuracy").compute(
        predictions=outputs["preds"][keep].cpu().numpy(),
        references=outputs["labels"][keep].cpu().numpy(),
    )["accuracy"]
