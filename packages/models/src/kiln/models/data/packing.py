"""Packing causal-LM documents into full rows, exactly.

A packed row holds several documents (or pieces of one) back to back, ``max_length`` tokens
in all. It trains exactly as the same pieces would one per row when each token attends only
within its own piece (:func:`document_mask`, a block-diagonal causal mask) and positions
restart at 0 for each piece. The first token of a piece has no label (-100): nothing before
it in its piece predicts it, as in a row of its own, so the loss and ``num_items`` count the
same real tokens.

Policies for a document that meets a row's end (``packing_policy``):

- ``carry``: fill every row to the last token; the document is split there and its
  remainder starts the next row as a new piece (it does not see its first part). Only the
  last row of the set has padding.
- ``whole``: a document that fits in a row is never split: when it does not fit in what is
  left of the current row, that row is padded and the document starts the next one.
  A document longer than ``max_length`` is cut into ``max_length`` pieces first.

Either way the documents are packed in a seeded random order (``seed``), so which documents
share a row is a function of the seed and the data alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from kiln.models.data.base import IGNORE_INDEX

PACKING_POLICIES = ("carry", "whole")
PACKED_KEYS = ("input_ids", "labels", "position_ids", "document_ids")
"""The keys of a packed row; ``document_ids`` is -1 on padding."""
PAD_DOCUMENT = -1


@dataclass(frozen=True)
class PackingStats:
    """What packing did to a set of documents (``CausalLMData.packing_stats``)."""

    policy: str
    seed: int
    max_length: int
    documents: int
    pieces: int
    """Pieces placed (a document split in two is two pieces)."""
    split_documents: int
    """Documents placed in more than one piece."""
    rows: int
    tokens: int
    """Real tokens placed (every document token: packing drops none)."""
    counted_tokens: int
    """Tokens with a label (each piece's first token has none)."""
    padding_fraction: float
    """The share of the rows' positions that hold padding."""

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def check_policy(policy: str) -> None:
    if policy not in PACKING_POLICIES:
        raise ValueError(
            f"packing_policy={policy!r} is not valid; choose one of: {', '.join(PACKING_POLICIES)}"
        )


def placements(
    lengths: Sequence[int], order: np.ndarray, max_length: int, policy: str, column: int = 0
) -> list[tuple[int, int, int, int, int]]:
    """(document, start in document, length, row, column) of every piece, row by row, from
    ``column`` of row 0 on (a stream packs each document after what the open row holds)."""
    pieces: list[tuple[int, int, int, int, int]] = []
    row = 0
    for doc in order.tolist():
        start, left = 0, int(lengths[doc])
        while left > 0:
            if policy == "whole" and min(left, max_length) > max_length - column:
                row, column = row + 1, 0  # pad this row; the piece starts the next one
            size = min(left, max_length - column)
            pieces.append((doc, start, size, row, column))
            start, left, column = start + size, left - size, column + size
            if column == max_length:
                row, column = row + 1, 0
    return pieces


def pack_documents(
    documents: Sequence[Sequence[int]],
    max_length: int,
    pad_token_id: int,
    policy: str = "carry",
    seed: int = 0,
) -> tuple[dict[str, np.ndarray], PackingStats]:
    """Pack tokenized ``documents`` into rows of ``max_length`` (see the module docstring).

    Args:
        documents: Token ids, one sequence per document (empty ones are skipped).
        max_length: Tokens per row.
        pad_token_id: The id of padding tokens (never counted: their label is -100).
        policy: ``carry`` or ``whole``.
        seed: Seeds the order the documents are packed in.

    Returns:
        ``input_ids``, ``labels``, ``position_ids`` and ``document_ids`` arrays of shape
        (rows, ``max_length``), and what packing did.

    Raises:
        ValueError: An unknown policy, ``max_length < 2``, or no document with a token.
    """
    check_policy(policy)
    if max_length < 2:
        raise ValueError(f"max_length={max_length!r} must be >= 2 to pack documents")
    lengths = [len(doc) for doc in documents]
    if not any(lengths):
        raise ValueError(f"no document to pack: all {len(documents)} documents are empty")
    order = np.random.default_rng(seed).permutation(len(documents))
    pieces = placements(lengths, order, max_length, policy)
    rows = pieces[-1][3] + 1
    arrays = fill_rows(documents, pieces, rows, max_length, pad_token_id)
    tokens = int(sum(lengths))
    split = len({doc for doc, start, *_ in pieces if start > 0})
    stats = PackingStats(
        policy=policy,
        seed=seed,
        max_length=max_length,
        documents=sum(1 for n in lengths if n),
        pieces=len(pieces),
        split_documents=split,
        rows=rows,
        tokens=tokens,
        counted_tokens=tokens - len(pieces),
        padding_fraction=1.0 - tokens / (rows * max_length),
    )
    return arrays, stats


def fill_rows(
    documents: Sequence[Sequence[int]],
    pieces: Sequence[tuple[int, int, int, int, int]],
    rows: int,
    max_length: int,
    pad_token_id: int,
) -> dict[str, np.ndarray]:
    """The ``PACKED_KEYS`` arrays (``rows``, ``max_length``) holding ``pieces``
    (:func:`placements`' tuples; ``documents[doc]`` holds each piece's tokens)."""
    ids = np.full((rows, max_length), pad_token_id, dtype=np.int64)
    labels = np.full((rows, max_length), IGNORE_INDEX, dtype=np.int64)
    document_ids = np.full((rows, max_length), PAD_DOCUMENT, dtype=np.int64)
    # padding restarts its positions too: its tokens attend among themselves, never to a piece
    positions = np.tile(np.arange(max_length, dtype=np.int64), (rows, 1))
    for doc, start, size, row, column in pieces:
        span = slice(column, column + size)
        tokens = np.asarray(documents[doc][start : start + size], dtype=np.int64)
        ids[row, span] = tokens
        labels[row, span] = tokens
        labels[row, column] = IGNORE_INDEX  # nothing in its piece predicts a first token
        document_ids[row, span] = doc
        positions[row, span] = np.arange(size)
    for row in range(rows):  # the padding after a row's last piece starts at position 0
        pad = document_ids[row] == PAD_DOCUMENT
        positions[row, pad] = np.arange(int(pad.sum()))
    return {
        "input_ids": ids,
        "labels": labels,
        "position_ids": positions,
        "document_ids": document_ids,
    }


def pieces_of(document_ids: torch.Tensor) -> list[tuple[int, int, int]]:
    """(row, start, end) of every piece in packed rows' ``document_ids`` (B, L), padding left
    out: the spans a document mask keeps apart."""
    out = []
    for row, ids in enumerate(document_ids.tolist()):
        start = 0
        for i in range(1, len(ids) + 1):
            if i == len(ids) or ids[i] != ids[start]:
                if ids[start] != PAD_DOCUMENT:
                    out.append((row, start, i))
                start = i
    return out


def document_mask(
    document_ids: torch.Tensor, additive_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """The 4-D attention mask (B, 1, L, L) of packed rows: token i attends to token j when
    both belong to the same piece (or both are padding) and j <= i.

    Args:
        document_ids: (B, L) ids of each token's piece; -1 on padding.
        additive_dtype: ``None`` for a boolean mask (True: attend), which SDPA takes; a
            float dtype for an additive one (0 or the dtype's minimum), which eager
            attention adds to its scores.
    """
    length = document_ids.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=document_ids.device).tril()
    allowed = (document_ids[:, :, None] == document_ids[:, None, :]) & causal
    allowed = allowed[:, None]
    if additive_dtype is None:
        return allowed
    zeros = torch.zeros(allowed.shape, dtype=additive_dtype, device=document_ids.device)
    return zeros.masked_fill(~allowed, torch.finfo(additive_dtype).min)
