"""Extractive question answering data: a question, a context, and the answer's token span."""

from __future__ import annotations

from typing import Any

from kiln.models.data.sources import GENERATED_QA
from kiln.models.data.text import TextData


class QuestionAnsweringData(TextData):
    """SQuAD-style rows tokenized as ``[CLS] question [SEP] context [SEP]``.

    ``labels`` is (start, end): the token positions of the answer's first and last token
    in the context, or (0, 0) (the ``[CLS]`` token, as transformers' QA examples do) where
    truncation cut the answer off. Defaults to kiln's generated QA data (``kiln/qa``:
    several facts of a kind per context, offline); a hub dataset maps its columns
    (``answer_column`` holds the text, ``answer_start_column`` its character offset).

    Args:
        question_column, context_column, answer_column, answer_start_column: The columns.
        max_length: Token length of question + context (the context is truncated).
        **kwargs: See ``TextClassificationData``.
    """

    fixed_keys = ("labels",)

    def __init__(
        self,
        dataset: str = GENERATED_QA,
        question_column: str = "question",
        context_column: str = "context",
        answer_column: str = "answer",
        answer_start_column: str = "answer_start",
        max_length: int = 64,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            dataset=dataset, text_column=context_column, max_length=max_length, **kwargs
        )
        self.question_column = question_column
        self.context_column = context_column
        self.answer_column = answer_column
        self.answer_start_column = answer_start_column

    def _columns(self) -> dict[str, str | None]:
        return {
            "question": self.question_column,
            "context": self.context_column,
            "answer": self.answer_column,
            "answer_start": self.answer_start_column,
        }

    def _encode(self, rows: dict[str, list], pad: bool) -> dict[str, list]:
        kwargs = {**self._tokenizer_kwargs(pad), "truncation": "only_second"}
        encoded = self.tokenizer(
            rows[self.question_column],
            rows[self.context_column],
            return_offsets_mapping=True,
            **kwargs,
        )
        labels = []
        for i, offsets in enumerate(encoded["offset_mapping"]):
            start_char = rows[self.answer_start_column][i]
            end_char = start_char + len(rows[self.answer_column][i])
            in_context = [j for j, s in enumerate(encoded.sequence_ids(i)) if s == 1]
            start = next((j for j in in_context if offsets[j][0] <= start_char < offsets[j][1]), 0)
            end = next((j for j in in_context if offsets[j][0] < end_char <= offsets[j][1]), 0)
            labels.append([start, end] if start and end >= start else [0, 0])
        out = {k: v for k, v in encoded.items() if k != "offset_mapping"}
        out["labels"] = labels
        return out
