"""Sequence-to-sequence data: a source text and the target the model learns to write."""

from __future__ import annotations

from typing import Any

from kiln.models.data.base import IGNORE_INDEX
from kiln.models.data.sources import GENERATED_REVERSE
from kiln.models.data.text import TextData


class Seq2SeqData(TextData):
    """Source/target rows for encoder-decoder models (T5, BART).

    ``input_ids`` / ``attention_mask`` hold the source; ``labels`` the target's tokens and an
    end-of-sequence token, padded with -100 to ``max_target_length`` (one shape: the
    decoder never recompiles), so the loss and ``num_items`` count real target tokens.
    Defaults to kiln's generated word reversal (``kiln/reverse``, offline).

    Args:
        source_column, target_column: The columns.
        max_target_length: Target tokens, end-of-sequence included (longer ones are cut).
        **kwargs: See ``TextClassificationData`` (``max_length`` is the source's).
    """

    fixed_keys = ("labels",)

    def __init__(
        self,
        dataset: str = GENERATED_REVERSE,
        source_column: str = "source",
        target_column: str = "target",
        max_target_length: int = 16,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset=dataset, text_column=source_column, **kwargs)
        if max_target_length < 2:
            raise ValueError(f"max_target_length={max_target_length!r} must be >= 2")
        self.source_column = source_column
        self.target_column = target_column
        self.max_target_length = max_target_length

    def _columns(self) -> dict[str, str | None]:
        return {"source": self.source_column, "target": self.target_column}

    def _encoding_options(self) -> list[Any]:
        return [self.max_target_length]

    def _encode(self, rows: dict[str, list], pad: bool) -> dict[str, list]:
        tok = self.tokenizer
        encoded = tok(rows[self.source_column], **self._tokenizer_kwargs(pad))
        out = {k: v for k, v in encoded.items() if k in ("input_ids", "attention_mask")}
        eos = tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id
        targets = tok(
            rows[self.target_column],
            add_special_tokens=False,
            truncation=True,
            max_length=self.max_target_length - 1,
        )["input_ids"]
        out["labels"] = [
            [*ids, eos] + [IGNORE_INDEX] * (self.max_target_length - len(ids) - 1)
            for ids in targets
        ]
        return out
