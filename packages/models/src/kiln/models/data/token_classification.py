"""Token classification data (named entities): words with one tag each."""

from __future__ import annotations

from typing import Any

import datasets

from kiln.models.data.base import IGNORE_INDEX
from kiln.models.data.sources import GENERATED_NER
from kiln.models.data.text import TextData


class TokenClassificationData(TextData):
    """Pre-split words and per-word tags (CoNLL style), tokenized with ``is_split_into_words``.

    Each word's first sub-token carries its tag; later sub-tokens, special tokens and
    padding carry -100 (skipped by the loss, the item count and the metrics). Defaults to
    kiln's generated entities (``kiln/ner``: IOB2 tags of people, places, organizations).

    Args:
        tokens_column: The column of word lists.
        tags_column: The column of tag lists (``ClassLabel`` names give the label names).
        **kwargs: See ``TextClassificationData``.
    """

    def __init__(
        self,
        dataset: str = GENERATED_NER,
        tokens_column: str = "tokens",
        tags_column: str = "tags",
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset=dataset, text_column=tokens_column, **kwargs)
        self.tokens_column = tokens_column
        self.tags_column = tags_column

    def _columns(self) -> dict[str, str | None]:
        return {"tokens": self.tokens_column, "tags": self.tags_column}

    @property
    def label_names(self) -> list[str] | None:
        """The tag names (from the ``ClassLabel`` inside the tags column), if it has them."""
        feature = self.raw()[0].features[self.tags_column]
        inner = getattr(feature, "feature", None)
        return list(inner.names) if isinstance(inner, datasets.ClassLabel) else None

    @property
    def num_labels(self) -> int:
        """Tags in the data (the ``ClassLabel`` size, or the largest tag + 1)."""
        names = self.label_names
        if names:
            return len(names)
        train, val = self.raw()
        return 1 + max(max(t, default=0) for split in (train, val) for t in split[self.tags_column])

    def attach(self, module: Any) -> None:
        super().attach(module)
        if module.num_labels < self.num_labels:
            raise ValueError(
                f"the model has num_labels={module.num_labels} but the data "
                f"({self.dataset!r}, column {self.tags_column!r}) has {self.num_labels} tags; "
                f"use num_labels={self.num_labels} (or None to infer)"
            )

    def _encode(self, rows: dict[str, list], pad: bool) -> dict[str, list]:
        encoded = self.tokenizer(
            rows[self.tokens_column], is_split_into_words=True, **self._tokenizer_kwargs(pad)
        )
        labels = []
        for i, tags in enumerate(rows[self.tags_column]):
            previous, row = None, []
            for word in encoded.word_ids(i):
                row.append(IGNORE_INDEX if word is None or word == previous else tags[word])
                previous = word
            labels.append(row)
        out = {k: v for k, v in encoded.items()}
        out["labels"] = labels
        return out
