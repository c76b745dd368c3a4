"""Masked language modelling data: text masked by transformers' MLM collator."""

from __future__ import annotations

from typing import Any

import datasets
import torch
from datasets.fingerprint import Hasher

from kiln.models.data.text import TextData


class MaskedLMData(TextData):
    """Text rows for a masked LM, masked by ``transformers.DataCollatorForLanguageModeling``
    (``mlm_probability`` of the real tokens chosen; of those 80% become ``[MASK]``, 10% a
    random token, 10% stay). ``labels`` hold the chosen tokens' ids and -100 elsewhere, so
    the loss and ``num_items`` count the chosen tokens only.

    Training batches are masked anew each time they are drawn (from torch's generator, which
    ``trainer.seed`` seeds); the validation set is masked once, seeded by ``seed``, so
    every evaluation scores the same masks. Defaults to the text of kiln's generated data.

    Args:
        mlm_probability: The share of tokens chosen, in (0, 1).
        **kwargs: See ``TextClassificationData`` (dataset, text_column, max_length...).
    """

    def __init__(self, mlm_probability: float = 0.15, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not 0.0 < mlm_probability < 1.0:
            raise ValueError(f"mlm_probability={mlm_probability!r} must be in (0, 1)")
        self.mlm_probability = mlm_probability
        self._collator: Any = None

    @property
    def collator(self) -> Any:
        """The transformers MLM collator over the data's tokenizer."""
        if self._collator is None:
            from transformers import DataCollatorForLanguageModeling

            if self.tokenizer is None or self.tokenizer.mask_token is None:
                raise ValueError(
                    "masked LM data needs a tokenizer with a mask token (BERT-style); "
                    f"{getattr(self.tokenizer, 'name_or_path', None)!r} has none"
                )
            self._collator = DataCollatorForLanguageModeling(
                self.tokenizer, mlm_probability=self.mlm_probability
            )
        return self._collator

    def _encode(self, rows: dict[str, list], pad: bool) -> dict[str, list]:
        encoded = self.tokenizer(
            rows[self.text_column], return_special_tokens_mask=True, **self._tokenizer_kwargs(pad)
        )
        keep = ("input_ids", "attention_mask", "special_tokens_mask")
        return {k: v for k, v in encoded.items() if k in keep}

    def _setup(self) -> None:
        super()._setup()
        self.val_set = self._mask_once(self.val_set)

    def _mask_once(self, data: datasets.Dataset) -> datasets.Dataset:
        """``data`` with seeded masks applied: ``labels`` added, the special-token mask gone."""
        fingerprint = Hasher.hash([data._fingerprint, self.mlm_probability, self.seed, "mask-v1"])

        def mask(rows: dict[str, list], indices: list[int]) -> dict[str, list]:
            out: dict[str, list] = {"input_ids": [], "labels": []}
            with torch.random.fork_rng(devices=[]):  # leaves the training stream alone
                torch.manual_seed(self.seed * 1_000_003 + indices[0])
                for ids, special in zip(
                    rows["input_ids"], rows["special_tokens_mask"], strict=True
                ):
                    inputs, labels = self.collator.torch_mask_tokens(
                        torch.tensor([ids]), torch.tensor([special])
                    )
                    out["input_ids"].append(inputs[0].tolist())
                    out["labels"].append(labels[0].tolist())
            return out

        masked = data.with_format(None).map(
            mask,
            batched=True,
            with_indices=True,
            remove_columns=["special_tokens_mask"],
            new_fingerprint=fingerprint,
            desc="masking",
        )
        return masked.with_format("torch")

    def collate(self, items: list[dict]) -> dict[str, torch.Tensor]:
        batch = super().collate(items)
        special = batch.pop("special_tokens_mask", None)
        if "labels" not in batch:  # a training batch: masked now, anew each epoch
            batch["input_ids"], batch["labels"] = self.collator.torch_mask_tokens(
                batch["input_ids"].clone(), special
            )
        return batch
