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

    The tags carry their names, which the model's ``id2label`` and the entity metrics
    (seqeval reads ``B-PER``, ``I-PER``, ``O``) need: a column of ``ClassLabel`` s (hub
    datasets such as CoNLL-2003) has them; a column of strings (a local ``.jsonl`` with
    ``"tags": ["B-PER", "O"]``) becomes one, ``O`` first, then the other tags sorted; a
    column of integers needs ``tag_names``.

    Args:
        tokens_column: The column of word lists.
        tags_column: The column of tag lists: ``ClassLabel`` s, strings, or integers.
        tag_names: The names of integer tags (``tag_names[i]`` names tag ``i``); ignored
            for tags that have names.
        **kwargs: See ``TextClassificationData``.

    Raises:
        ValueError: (when the data loads: at ``create_model``) integer tags without
            ``tag_names``, or a tag beyond them.
    """

    def __init__(
        self,
        dataset: str = GENERATED_NER,
        tokens_column: str = "tokens",
        tags_column: str = "tags",
        tag_names: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset=dataset, text_column=tokens_column, **kwargs)
        self.tokens_column = tokens_column
        self.tags_column = tags_column
        self.tag_names = list(tag_names) if tag_names is not None else None

    def raw(self) -> tuple[datasets.Dataset, datasets.Dataset]:
        if self._raw is None:
            train, val = super().raw()
            label = self._tag_feature(train, val)
            if label is not None:
                feature = datasets.List(label)
                train = train.cast_column(self.tags_column, feature)
                val = val.cast_column(self.tags_column, feature)
            self._raw = (train, val)
        return self._raw

    def _tag_feature(
        self, train: datasets.Dataset, val: datasets.Dataset
    ) -> datasets.ClassLabel | None:
        """The ``ClassLabel`` the tags column becomes (``None``: it is one already)."""
        inner = getattr(train.features[self.tags_column], "feature", None)
        if isinstance(inner, datasets.ClassLabel):
            return None
        seen = {t for split in (train, val) for tags in split[self.tags_column] for t in tags}
        where = f"dataset {self.dataset!r}, column {self.tags_column!r}"
        if "string" in str(getattr(inner, "dtype", "")):
            return datasets.ClassLabel(names=sorted(seen, key=lambda t: (t != "O", t)))
        if self.tag_names is None:
            raise ValueError(
                f"{where} holds integer tags without names ({sorted(seen)[:10]}): the entity "
                "metrics need the IOB2 names. Pass tag_names=[O, B-PER, I-PER, ...] "
                "(tag_names[i] names tag i; data.tag_names=[...] in kiln-train), or write the "
                'tags as strings ("tags": ["B-PER", "O"])'
            )
        beyond = sorted(t for t in seen if not 0 <= t < len(self.tag_names))
        if beyond:
            raise ValueError(
                f"{where} has tag {beyond[0]} but tag_names names {len(self.tag_names)} tags "
                f"(0..{len(self.tag_names) - 1}): {self.tag_names}"
            )
        return datasets.ClassLabel(names=self.tag_names)

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
