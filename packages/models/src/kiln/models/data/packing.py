"""Packing causal-LM documents into full rows, exactly.

A packed row holds several documents (or pieces of one) back to back, ``max_length`` tokens
in all. It trains exactly as the same pieces would one per row when each token attends only
within its own piece (:func:`document_mask`, a block-diagonal causal mask) and positions
restart at 0 for each piece. The first token of a piece has no label (-100): nothing before
it in its piece predicts it, as in a row of its own, so the loss and ``num_items`` count the
same real tokens.

Policies for a document that meets a row's end (``packing_policy``):

- ``best_fit`` (the default): no document that fits in a row is split, and the rows are
  filled as tightly as a greedy packing can: each piece, longest first, goes into the open
  row with the least room that still holds it, or starts a new row (best-fit decreasing,
  TRL's ``bfd``). A document longer than ``max_length`` is cut into ``max_length`` pieces
  first. It needs every document before the first row is made, so a stream cannot use it.
  Rows come out grouped by their pieces' lengths; a shuffled loader mixes them.
- ``whole`` (a stream's default): a document that fits in a row is never split either: when
  it does not fit in what is left of the current row, that row is padded and the document
  starts the next one (longer ones are cut into ``max_length`` pieces first).
- ``carry``: fill every row to the last token; the document is split there and its
  remainder starts the next row as a new piece. That piece does not see its first part and
  its first token has no label, so a split document scores what two documents would, not
  what it scores whole. Only the last row of the set has padding.

Every policy places the documents in a seeded random order (``seed``; ``best_fit`` breaks
ties between pieces of one length with it), so which documents share a row is a function of
the seed and the data alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from kiln.models.data.base import IGNORE_INDEX

PACKING_POLICIES = ("carry", "whole", "best_fit")
DEFAULT_POLICY = "best_fit"
STREAM_POLICY = "whole"
"""The defaults, map-style and streamed: both keep every document that fits a row whole."""
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


def default_policy(policy: str | None, streaming: bool = False) -> str:
    """``policy``, or for ``None`` the default: ``best_fit``, or ``whole`` for a stream."""
    if policy is None:
        return STREAM_POLICY if streaming else DEFAULT_POLICY
    return policy


def check_policy(policy: str, streaming: bool = False) -> None:
    """Fail unless ``policy`` is one of ``PACKING_POLICIES`` (and one a stream can use)."""
    if policy not in PACKING_POLICIES:
        raise ValueError(
            f"packing_policy={policy!r} is not valid; choose one of: {', '.join(PACKING_POLICIES)}"
        )
    if streaming and policy == "best_fit":
        raise ValueError(
            "packing_policy='best_fit' packs a whole data set at once; a stream "
            "(streaming=true) packs documents as it reads them: use carry or whole"
        )


def placements(
    lengths: Sequence[int], order: np.ndarray, max_length: int, policy: str, column: int = 0
) -> list[tuple[int, int, int, int, int]]:
    """(document, start in document, length, row, column) of every piece, row by row, from
    ``column`` of row 0 on (a stream packs each document after what the open row holds), by
    the ``carry`` or ``whole`` policy."""
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


class _OpenRows:
    """Rows with room left, by that room: the fullest row that still holds ``need`` tokens
    in O(log max_length) (a segment tree over the room, 1 to ``max_length``)."""

    def __init__(self, max_length: int) -> None:
        self.leaves = 1 << max_length.bit_length()  # > max_length: a leaf per room
        self.counts = [0] * (2 * self.leaves)
        self.rows: list[list[int]] = [[] for _ in range(max_length + 1)]

    def _count(self, room: int, change: int) -> None:
        node = room + self.leaves
        while node:
            self.counts[node] += change
            node //= 2

    def add(self, room: int, row: int) -> None:
        self.rows[room].append(row)
        self._count(room, 1)

    def take(self, need: int) -> int | None:
        """Take the row with the least room >= ``need`` out of the open rows (``None``: none)."""
        room = self._least(1, 0, self.leaves, need)
        if room is None:
            return None
        self._count(room, -1)
        return self.rows[room].pop()

    def _least(self, node: int, low: int, high: int, need: int) -> int | None:
        """The least room in [max(low, need), high) that an open row has (``node`` covers
        rooms [low, high))."""
        if high <= need or not self.counts[node]:
            return None
        if high - low == 1:
            return low
        middle = (low + high) // 2
        left = self._least(2 * node, low, middle, need)
        return left if left is not None else self._least(2 * node + 1, middle, high, need)


def best_fit_placements(
    lengths: Sequence[int], order: np.ndarray, max_length: int
) -> list[tuple[int, int, int, int, int]]:
    """:func:`placements` of the ``best_fit`` policy (see the module docstring), row by row."""
    items: list[tuple[int, int, int, int]] = []  # (size, rank in the seeded order, doc, start)
    for rank, doc in enumerate(order.tolist()):
        for start in range(0, int(lengths[doc]), max_length):
            items.append((min(max_length, int(lengths[doc]) - start), rank, doc, start))
    items.sort(key=lambda item: (-item[0], item[1]))
    open_rows = _OpenRows(max_length)
    filled: list[int] = []  # tokens in each row so far
    pieces: list[tuple[int, int, int, int, int]] = []
    for size, _, doc, start in items:
        row = open_rows.take(size)
        if row is None:
            row = len(filled)
            filled.append(0)
        pieces.append((doc, start, size, row, filled[row]))
        filled[row] += size
        if filled[row] < max_length:
            open_rows.add(max_length - filled[row], row)
    return sorted(pieces, key=lambda piece: (piece[3], piece[4]))


def pack_documents(
    documents: Sequence[Sequence[int]],
    max_length: int,
    pad_token_id: int,
    policy: str = DEFAULT_POLICY,
    seed: int = 0,
) -> tuple[dict[str, np.ndarray], PackingStats]:
    """Pack tokenized ``documents`` into rows of ``max_length`` (see the module docstring).

    Args:
        documents: Token ids, one sequence per document (empty ones are skipped).
        max_length: Tokens per row.
        pad_token_id: The id of padding tokens (never counted: their label is -100).
        policy: ``best_fit``, ``whole`` or ``carry``.
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
    if policy == "best_fit":
        pieces = best_fit_placements(lengths, order, max_length)
    else:
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
