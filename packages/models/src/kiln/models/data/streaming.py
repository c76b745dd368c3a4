"""Packed rows streamed from local shards, with a position a checkpoint can hold.

Each reader of the stream (a rank, or one DataLoader worker of a rank: ``slots`` of them in
all) reads the shards in a seeded order per pass, takes every ``slots``-th document (its own:
no two readers share one), tokenizes it when it reaches it, packs it with
:func:`kiln.models.data.packing.placements` after what its open row holds, and hands the
rows out through a seeded shuffle buffer. When the shards are done it starts the next pass
(a new shard order; the open row carries over): the stream is endless, and a run trains for
``trainer.max_steps``. A pass guarantees each reader's own documents once each, not a
moment when every document has been trained on equally: readers get different numbers of
tokens, so they reach a pass's end at different steps, and a row can mix the end of one pass
with the start of the next.

:meth:`ShardStream.state_dict` is everything that decides the rows still to come: the pass,
the shard and row it reads next, the open row's pieces, the shuffle buffer and its
generator's state. torchdata's ``StatefulDataLoader`` takes it from each worker after every
batch, so a checkpoint holds each reader's position as of the last batch trained on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from kiln.models.data.packing import (
    PACKED_KEYS,
    STREAM_POLICY,
    check_policy,
    fill_rows,
    placements,
)
from kiln.models.data.shards import read_texts

log = logging.getLogger(__name__)

Encode = Callable[[list[str]], list[list[int]]]
"""Texts to token ids, whole (no truncation): packing splits documents, never the tokenizer."""

TOKENIZE_CHUNK = 64  # documents tokenized in one call (a fast tokenizer's batch)


class ShardStream(IterableDataset[dict[str, torch.Tensor]]):
    """Endless packed rows of ``max_length`` tokens from ``files`` (see the module docstring).

    Args:
        files: The shards, in a fixed order (:func:`kiln.models.data.shards.shard_files`).
        text_column: The column (Parquet) or key (JSON Lines) holding a document's text.
        encode: Tokenizes a list of texts.
        max_length: Tokens per row.
        pad_token_id: The id of padding tokens.
        policy: The packing policy (``whole`` or ``carry``).
        seed: Seeds the shard order of each pass and the shuffle buffer.
        shuffle_buffer: Rows held to draw from at random (1: the packing order).
        rank: This process's rank; world_size: processes reading the stream.
    """

    def __init__(
        self,
        files: Sequence[Path],
        text_column: str,
        encode: Encode,
        max_length: int,
        pad_token_id: int,
        policy: str = STREAM_POLICY,
        seed: int = 0,
        shuffle_buffer: int = 64,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        check_policy(policy, streaming=True)
        if shuffle_buffer < 1:
            raise ValueError(f"shuffle_buffer={shuffle_buffer!r} must be >= 1 (1: no shuffling)")
        self.files = list(files)
        self.text_column = text_column
        self.encode = encode
        self.max_length = max_length
        self.pad_token_id = pad_token_id
        self.policy = policy
        self.seed = seed
        self.shuffle_buffer = shuffle_buffer
        self.rank, self.world_size = rank, world_size
        self._loaded: dict[str, Any] | None = None
        self._texts: tuple[tuple[int, int], list[str]] | None = None  # being read (not state)
        self._tokens: dict[int, list[int]] = {}  # tokenized ahead, by row (not state)
        self._reset()

    # -- the position -----------------------------------------------------------------
    def _reset(self) -> None:
        self.slot, self.slots = self._reader()
        self.epoch, self.shard, self.row = 0, 0, 0  # the next document to read
        self.open: list[list[int]] = []  # the pieces of the row being packed
        self.buffer: list[torch.Tensor] = []  # rows (len(PACKED_KEYS), max_length)
        self.rng = np.random.default_rng([self.seed, self.slot])
        self._texts, self._tokens = None, {}

    def _reader(self) -> tuple[int, int]:
        worker = get_worker_info()
        workers, worker_id = (1, 0) if worker is None else (worker.num_workers, worker.id)
        return self.rank * workers + worker_id, self.world_size * workers

    def state_dict(self) -> dict[str, Any]:
        """This reader's position: what decides every row it has yet to yield."""
        return {
            "slot": self.slot,
            "slots": self.slots,
            "epoch": self.epoch,
            "shard": self.shard,
            "row": self.row,
            "open": [list(piece) for piece in self.open],
            "buffer": torch.stack(self.buffer) if self.buffer else None,
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (:meth:`state_dict`) at the next iteration."""
        self._loaded = state

    def _restore(self, state: dict[str, Any]) -> None:
        if (state["slot"], state["slots"]) != (self.slot, self.slots):
            raise ValueError(
                f"the stream's state is reader {state['slot']} of {state['slots']} (ranks x "
                f"workers), this one is reader {self.slot} of {self.slots}: each reads its own "
                "documents, so resume with the world size and num_workers it was saved with"
            )
        self.epoch, self.shard, self.row = state["epoch"], state["shard"], state["row"]
        self.open = [list(piece) for piece in state["open"]]
        buffer = state["buffer"]
        self.buffer = [] if buffer is None else list(buffer.unbind(0))
        self.rng.bit_generator.state = state["rng"]

    # -- reading -----------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        self._reset()  # in the worker: it knows its slot now
        if self._loaded is not None:
            state, self._loaded = self._loaded, None
            self._restore(state)
        if len(self.buffer) < self.shuffle_buffer:  # before the first row: a stop can come here
            log.info(
                "reader %d of %d: filling a shuffle buffer of %d rows",
                self.slot, self.slots, self.shuffle_buffer,
            )  # fmt: skip
        while True:
            while len(self.buffer) < self.shuffle_buffer:
                self._pack(self._next_document())
            # one of the oldest shuffle_buffer rows (a long document can add several at once)
            row = self.buffer.pop(int(self.rng.integers(self.shuffle_buffer)))
            yield dict(zip(PACKED_KEYS, row.unbind(0), strict=True))

    def _order(self) -> list[int]:
        """The shards' order in this pass."""
        return np.random.default_rng([self.seed, self.epoch]).permutation(len(self.files)).tolist()

    def _next_document(self) -> list[int]:
        """The next document of this reader, tokenized; the position moves past it."""
        passes_without_one = 0
        while True:
            if self.shard == len(self.files):  # the pass is done: the next one
                if passes_without_one:  # a whole pass with no document: it would never end
                    raise ValueError(
                        f"reader {self.slot} of {self.slots} (ranks x workers) gets no "
                        f"document with a token from the {len(self.files)} shards; use fewer "
                        "processes or data.num_workers, or more documents"
                    )
                passes_without_one = 1
                self.epoch, self.shard, self.row = self.epoch + 1, 0, 0
                continue
            texts = self._shard_texts()
            while self.row < len(texts) and self.row % self.slots != self.slot:
                self.row += 1
            if self.row >= len(texts):
                self.shard, self.row = self.shard + 1, 0
                continue
            tokens = self._tokenized(texts, self.row)
            self.row += 1
            if tokens:
                return tokens

    def _shard_texts(self) -> list[str]:
        index = self._order()[self.shard]
        if self._texts is None or self._texts[0] != (self.epoch, index):
            self._texts = ((self.epoch, index), read_texts(self.files[index], self.text_column))
            self._tokens = {}
        return self._texts[1]

    def _tokenized(self, texts: list[str], row: int) -> list[int]:
        """Row ``row``'s tokens; this reader's next few documents are tokenized with it."""
        if row not in self._tokens:
            rows = list(range(row, len(texts), self.slots))[:TOKENIZE_CHUNK]
            self._tokens = dict(zip(rows, self.encode([texts[r] for r in rows]), strict=True))
        return self._tokens.pop(row)

    # -- packing -----------------------------------------------------------------------
    def _pack(self, tokens: list[int]) -> None:
        """Place ``tokens`` after the open row's pieces; full rows go to the buffer."""
        column = sum(len(piece) for piece in self.open)
        pieces = placements([len(tokens)], np.zeros(1, dtype=np.int64), self.max_length,
                            self.policy, column)  # fmt: skip
        documents = [*self.open, tokens]
        new = len(self.open)
        laid = [(i, 0, len(p), 0, start) for i, p, start in _columns(self.open)]
        laid += [(new, start, size, row, col) for _, start, size, row, col in pieces]
        _, _, last_size, last_row, last_col = pieces[-1]
        full = last_row + (
            last_col + last_size == self.max_length
        )  # rows complete; the last one may be open
        if full:
            arrays = fill_rows(documents, [p for p in laid if p[3] < full], full,
                               self.max_length, self.pad_token_id)  # fmt: skip
            rows = torch.from_numpy(np.stack([arrays[key] for key in PACKED_KEYS], axis=1))
            self.buffer.extend(rows.unbind(0))
        self.open = [documents[d][s : s + n] for d, s, n, r, _ in laid if r == full]


def _columns(pieces: list[list[int]]) -> list[tuple[int, list[int], int]]:
    """(index, piece, starting column) of the open row's pieces."""
    out, column = [], 0
    for i, piece in enumerate(pieces):
        out.append((i, piece, column))
        column += len(piece)
    return out
