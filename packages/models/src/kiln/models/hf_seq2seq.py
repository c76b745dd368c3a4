"""Sequence-to-sequence LMs (T5, BART: ``AutoModelForSeq2SeqLM``), token-weighted."""

from __future__ import annotations

from typing import Any

import torch

from kiln.models.data.base import IGNORE_INDEX
from kiln.models.hf import TINY_TEXT, config_built, tiny_for_arch
from kiln.models.hf_token_module import HFTokenModule
from kiln.models.metrics import load_metric
from kiln.models.registry import register_alias, register_model
from kiln.models.tokens import (
    perplexity,
    token_accuracy,
)


class HFSeq2SeqLM(HFTokenModule):
    """An encoder-decoder LM (``...ForConditionalGeneration``) on ``Seq2SeqData``.

    The decoder reads the labels shifted right (the model's own
    ``prepare_decoder_input_ids_from_labels``: teacher forcing); ``num_items`` is the
    number of target tokens that are not -100, as for the causal LM. Metrics (teacher
    forced, so one static shape and no generation loop): token accuracy, exact match (every
    target token right), perplexity and loss. Config-built models start decoding at the
    tokenizer's ``[CLS]`` (or BOS) token.

    ``kiln-eval`` also generates (``generate_texts``: greedy, up to the data's
    ``max_target_length`` new tokens) and scores the text (``generation_metrics``: exact
    match, sacreBLEU and chrF, keys ``generation_keys``).

    Args:
        **kwargs: See ``HFModule`` (``arch`` defaults to ``t5``; ``bart`` works too).
    """

    task = "seq2seq-lm"
    metric_keys = ("accuracy", "exact_match", "perplexity", "loss")
    generation_keys = ("exact_match", "bleu", "chrf")
    items_are_tokens = True
    auto_class_name = "AutoModelForSeq2SeqLM"

    def __init__(self, arch: str = "t5", data: Any = None, **kwargs: Any) -> None:
        super().__init__(arch=arch, data=data, **kwargs)

    @classmethod
    def tiny_data(cls) -> Any:
        from kiln.models.data import Seq2SeqData

        return Seq2SeqData(**TINY_TEXT)

    def _token_defaults(self) -> dict[str, Any]:
        defaults = super()._token_defaults()
        return {**defaults, "decoder_start_token_id": defaults["bos_token_id"]}

    def model_inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask") if k in batch}
        labels = batch["labels"]
        inputs["decoder_input_ids"] = self.model.prepare_decoder_input_ids_from_labels(
            labels=labels
        )
        return inputs

    def validation_metrics(self, outputs: dict[str, torch.Tensor]) -> dict[str, float]:
        labels = outputs["labels"]
        real = labels[:, 0] != IGNORE_INDEX  # drops the validation padding rows
        right = ((outputs["preds"] == labels) | (labels == IGNORE_INDEX)).all(1)[real]
        exact = load_metric("accuracy").compute(
            predictions=right.long().cpu().numpy(), references=[1] * int(real.sum())
        )["accuracy"]
        return {"accuracy": token_accuracy(outputs), "exact_match": exact, **perplexity(outputs)}

    def generate_texts(self, batch: dict[str, torch.Tensor]) -> tuple[list[str], list[str]]:
        """Greedy generations for the batch's inputs and its targets, decoded (the data's
        padding rows, which have no target, dropped)."""
        labels = batch["labels"]
        real = labels[:, 0] != IGNORE_INDEX
        length = getattr(self.data_module, "max_target_length", labels.shape[1])
        generated = self.model.generate(
            input_ids=batch["input_ids"][real],
            attention_mask=batch["attention_mask"][real],
            max_new_tokens=length,
            do_sample=False,
            num_beams=1,
        )
        targets = labels[real].masked_fill(
            labels[real] == IGNORE_INDEX, self.tokenizer.pad_token_id
        )
        decode = self.tokenizer.batch_decode
        return decode(generated, skip_special_tokens=True), decode(
            targets, skip_special_tokens=True
        )

    def generation_metrics(self, predictions: list[str], references: list[str]) -> dict[str, float]:
        """Exact match, sacreBLEU and chrF of generated texts (``metrics/generated_text``)."""
        metric = load_metric("generated_text")
        scores = metric.compute(predictions=predictions, references=references) or {}
        return {key: float(scores[key]) for key in self.generation_keys}

    def example_batch(self, batch_size: int, device: Any = None) -> dict[str, torch.Tensor]:
        ids = self._example_ids(batch_size, self._example_length(), device)
        length = getattr(self.data_module, "max_target_length", 16)
        labels = self._example_ids(batch_size, length, device)
        labels[:, length * 3 // 4 :] = IGNORE_INDEX  # a padded tail, as the data has
        return self._unpadded_batch(ids, labels)


@register_model("hf-seq2seq", task="seq2seq-lm", tiny=tiny_for_arch("t5"))
def hf_seq2seq(arch: str = "t5", **kwargs: Any) -> HFSeq2SeqLM:
    """A sequence-to-sequence LM for any HF encoder-decoder ``arch`` (``t5``, ``bart``...)."""
    return HFSeq2SeqLM(arch=arch, **kwargs)


for _arch, _doc in (("t5", "T5 (relative positions)"), ("bart", "BART")):
    register_alias(
        f"{_arch}-tiny-seq2seq",
        "hf-seq2seq",
        f"A 2+2-layer, 32-wide {_doc} encoder-decoder from a config, for tests.",
        fixed={"arch": _arch},
        defaults=config_built(_arch),
    )
