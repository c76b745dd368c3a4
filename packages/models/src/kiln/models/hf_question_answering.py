"""Extractive question answering (``AutoModelForQuestionAnswering``): start/end logits."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from kiln.models.data.base import IGNORE_INDEX
from kiln.models.hf import TINY_TEXT, HFModule, config_built, tiny_for_arch
from kiln.models.metrics import load_metric
from kiln.models.module import at_least_fp32
from kiln.models.registry import register_alias, register_model


class HFQuestionAnswering(HFModule):
    """Extractive QA on ``QuestionAnsweringData``: ``labels`` (B, 2) hold the answer's
    first and last token.

    The loss is the mean of the start and end cross-entropies (per sample; items are
    samples). Validation picks the best-scoring span (start <= end, at most
    ``max_answer_tokens`` long, inside the attention mask) and scores its decoded text
    against the reference span's with SQuAD's exact match and F1.

    Args:
        max_answer_tokens: The longest span validation predicts.
        **kwargs: See ``HFModule`` (``arch`` defaults to ``bert``).
    """

    task = "question-answering"
    metric_keys = ("exact_match", "f1", "loss")
    auto_class_name = "AutoModelForQuestionAnswering"

    def __init__(
        self, arch: str = "bert", max_answer_tokens: int = 30, data: Any = None, **kwargs: Any
    ) -> None:
        if max_answer_tokens < 1:
            raise ValueError(f"max_answer_tokens={max_answer_tokens!r} must be >= 1")
        super().__init__(arch=arch, data=data, **kwargs)
        self.max_answer_tokens = max_answer_tokens

    @classmethod
    def tiny_data(cls) -> Any:
        from kiln.models.data import QuestionAnsweringData

        return QuestionAnsweringData(**{**TINY_TEXT, "max_length": 48})

    def span_logits(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Start and end logits (B, L), at least float32."""
        out = self.model(**self.model_inputs(batch))
        return at_least_fp32(out.start_logits), at_least_fp32(out.end_logits)

    def _span_losses(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        start, end = self.span_logits(batch)
        labels = batch["labels"]
        losses = [
            F.cross_entropy(logits, labels[:, i], ignore_index=IGNORE_INDEX, reduction="none")
            for i, logits in enumerate((start, end))
        ]
        return start, end, (losses[0] + losses[1]) / 2

    def loss_and_count(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
        _, _, loss = self._span_losses(batch)
        return loss.mean(), batch["labels"].shape[0]

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict:
        start, end, loss = self._span_losses(batch)
        length = start.shape[1]
        scores = start[:, :, None] + end[:, None, :]  # (B, start, end)
        offsets = torch.arange(length, device=start.device)
        gap = offsets[None, :] - offsets[:, None]
        allowed = (gap >= 0) & (gap < self.max_answer_tokens)
        mask = batch["attention_mask"].bool()
        allowed = allowed[None] & mask[:, :, None] & mask[:, None, :]
        best = scores.masked_fill(~allowed, float("-inf")).flatten(1).argmax(-1)
        return {
            "start": best // length,
            "end": best % length,
            "labels": batch["labels"],
            "input_ids": batch["input_ids"],
            "loss": loss,
        }

    def validation_metrics(self, outputs: dict[str, torch.Tensor]) -> dict[str, float]:
        keep = outputs["labels"][:, 0] != IGNORE_INDEX  # drops the validation padding rows
        ids = outputs["input_ids"][keep].tolist()
        spans = zip(outputs["start"][keep].tolist(), outputs["end"][keep].tolist(), strict=True)
        refs = outputs["labels"][keep].tolist()
        decode = self.tokenizer.decode
        scores = load_metric("squad").compute(
            predictions=[decode(row[s : e + 1]) for row, (s, e) in zip(ids, spans, strict=True)],
            references=[decode(row[s : e + 1]) for row, (s, e) in zip(ids, refs, strict=True)],
        )
        return {**scores, "loss": float(outputs["loss"][keep].mean())}

    def example_batch(self, batch_size: int, device: Any = None) -> dict[str, torch.Tensor]:
        length = self._example_length()
        ids = self._example_ids(batch_size, length, device)
        start = torch.arange(batch_size) % (length // 2) + 1
        labels = torch.stack([start, start + 2], dim=1).to(device)
        return self._unpadded_batch(ids, labels)


@register_model("hf-qa", task="question-answering", tiny=tiny_for_arch("bert"))
def hf_qa(arch: str = "bert", **kwargs: Any) -> HFQuestionAnswering:
    """Extractive QA for any HF ``arch`` (``bert``, ``roberta``, ``distilbert``...)."""
    return HFQuestionAnswering(arch=arch, **kwargs)


register_alias(
    "bert-tiny-qa",
    "hf-qa",
    "A 2-layer, 32-wide BERT extractive QA model from a config, for tests.",
    fixed={"arch": "bert"},
    defaults=config_built("bert"),
)
