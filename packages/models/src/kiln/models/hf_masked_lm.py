"""Masked language models (BERT family, ``AutoModelForMaskedLM``), token-weighted."""

from __future__ import annotations

from typing import Any

import torch

from kiln.models.data.base import IGNORE_INDEX
from kiln.models.hf import TINY_TEXT, config_built, tiny_for_arch
from kiln.models.hf_token_module import HFTokenModule
from kiln.models.registry import register_alias, register_model
from kiln.models.tokens import (
    perplexity,
    token_accuracy,
)


class HFMaskedLM(HFTokenModule):
    """Masked language modelling (``AutoModelForMaskedLM``) on ``MaskedLMData``.

    ``num_items`` is the number of masked (label) tokens, so accumulation weights
    micro-batches by them. Metrics: the masked tokens' accuracy, perplexity and loss.

    Args:
        **kwargs: See ``HFModule`` (``arch`` defaults to ``bert``).
    """

    task = "masked-lm"
    metric_keys = ("accuracy", "perplexity", "loss")
    items_are_tokens = True
    auto_class_name = "AutoModelForMaskedLM"

    def __init__(self, arch: str = "bert", data: Any = None, **kwargs: Any) -> None:
        super().__init__(arch=arch, data=data, **kwargs)

    @classmethod
    def tiny_data(cls) -> Any:
        from kiln.models.data import MaskedLMData

        return MaskedLMData(**TINY_TEXT)

    def validation_metrics(self, outputs: dict[str, torch.Tensor]) -> dict[str, float]:
        return {"accuracy": token_accuracy(outputs), **perplexity(outputs)}

    def example_batch(self, batch_size: int, device: Any = None) -> dict[str, torch.Tensor]:
        ids = self._example_ids(batch_size, self._example_length(), device)
        chosen = torch.arange(ids.shape[1], device=ids.device) % 7 == 3  # about 15%
        labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE_INDEX))
        return self._unpadded_batch(ids, labels)


@register_model("hf-mlm", task="masked-lm", tiny=tiny_for_arch("bert"))
def hf_mlm(arch: str = "bert", **kwargs: Any) -> HFMaskedLM:
    """A masked LM for any HF ``arch`` (``bert``, ``roberta``, ``distilbert``...)."""
    return HFMaskedLM(arch=arch, **kwargs)


register_alias(
    "bert-tiny-mlm",
    "hf-mlm",
    "A 2-layer, 32-wide BERT masked LM from a config, for tests.",
    fixed={"arch": "bert"},
    defaults=config_built("bert"),
)
