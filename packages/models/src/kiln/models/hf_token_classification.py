"""Token classification (named entities: ``AutoModelForTokenClassification``)."""

from __future__ import annotations

from typing import Any

import torch

from kiln.models.data.base import IGNORE_INDEX
from kiln.models.hf import TINY_TEXT, config_built, label_head, tiny_for_arch
from kiln.models.hf_token_module import HFTokenModule
from kiln.models.metrics import load_metric
from kiln.models.registry import register_alias, register_model

SEQEVAL_MODES = ("default", "strict")
"""The entity-matching modes of the metrics (``metrics/seqeval``)."""


class HFTokenClassifier(HFTokenModule):
    """Per-token classification on ``TokenClassificationData`` (labels -100 where skipped).

    The loss is token-weighted: ``num_items`` is the number of labelled tokens (each
    word's first sub-token). Metrics, over the labelled tokens: seqeval-style entity
    precision, recall and F1 of the IOB2 tags (the data's label names), token accuracy,
    and the loss.

    Args:
        num_labels: Tags; ``None`` takes them (and their names) from the data (9 without).
        seqeval_mode: ``"default"``: seqeval's default, lenient IOB2 (an ``I-X`` that
            continues no ``X`` starts an entity: ``I-PER I-PER`` matches ``B-PER I-PER``);
            ``"strict"``: seqeval's ``mode="strict", scheme=IOB2`` (entities start at
            ``B-X`` only).
        **kwargs: See ``HFModule`` (``arch`` defaults to ``bert``).
    """

    task = "token-classification"
    metric_keys = ("accuracy", "precision", "recall", "f1", "loss")
    auto_class_name = "AutoModelForTokenClassification"

    def __init__(
        self,
        num_labels: int | None = None,
        arch: str = "bert",
        data: Any = None,
        seqeval_mode: str = "default",
        **kwargs: Any,
    ) -> None:
        if seqeval_mode not in SEQEVAL_MODES:
            raise ValueError(
                f"seqeval_mode={seqeval_mode!r} is not valid; choose one of: {SEQEVAL_MODES}"
            )
        head = label_head(num_labels, data, default=9)
        super().__init__(arch=arch, data=data, **kwargs, **head)
        self.num_labels = head["num_labels"]
        self.seqeval_mode = seqeval_mode

    @classmethod
    def tiny_data(cls) -> Any:
        from kiln.models.data import TokenClassificationData

        return TokenClassificationData(**TINY_TEXT)

    def validation_metrics(self, outputs: dict[str, torch.Tensor]) -> dict[str, float]:
        names = self.model.config.id2label
        predictions, references = [], []
        for preds, labels in zip(
            outputs["preds"].tolist(), outputs["labels"].tolist(), strict=True
        ):
            kept = [(p, t) for p, t in zip(preds, labels, strict=True) if t != IGNORE_INDEX]
            if kept:  # validation padding rows hold no labels
                predictions.append([names[p] for p, _ in kept])
                references.append([names[t] for _, t in kept])
        scores = load_metric("seqeval").compute(
            predictions=predictions, references=references, mode=self.seqeval_mode
        )
        loss = float(outputs["nll_sum"].double().sum() / outputs["tokens"].sum())
        return {**scores, "loss": loss}

    def example_batch(self, batch_size: int, device: Any = None) -> dict[str, torch.Tensor]:
        ids = self._example_ids(batch_size, self._example_length(), device)
        labels = torch.arange(ids.numel(), device=ids.device).view_as(ids) % self.num_labels
        labels[:, 0] = IGNORE_INDEX  # the [CLS] token, as the data has it
        return self._unpadded_batch(ids, labels)


@register_model("hf-token-cls", task="token-classification", tiny=tiny_for_arch("bert"))
def hf_token_cls(arch: str = "bert", **kwargs: Any) -> HFTokenClassifier:
    """Token classification for any HF ``arch`` (``bert``, ``roberta``, ``distilbert``...)."""
    return HFTokenClassifier(arch=arch, **kwargs)


register_alias(
    "bert-tiny-token-cls",
    "hf-token-cls",
    "A 2-layer, 32-wide BERT token classifier from a config, for tests.",
    fixed={"arch": "bert"},
    defaults=config_built("bert"),
)
