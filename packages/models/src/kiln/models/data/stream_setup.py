"""``CausalLMData(streaming=True)``: training rows streamed from shards, validation as usual.

The training shards are found and checked when the data is set up (before any run or
checkpoint is written) and read only by the training loader's :class:`ShardStream`, a
torchdata ``StatefulDataLoader`` whose position kiln's loop saves in every checkpoint
(``kiln.core.loop.stream``). The validation shards are loaded, tokenized and packed as the
map-style data module does it: they are small, and every validation sees all of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from torchdata.stateful_dataloader import StatefulDataLoader

from kiln.models.data.packing import PACKED_KEYS
from kiln.models.data.shards import check_shards, shard_files
from kiln.models.data.sources import check_columns, load_splits
from kiln.models.data.streaming import ShardStream

if TYPE_CHECKING:
    from kiln.models.data.text import CausalLMData


def check_streaming(data: CausalLMData) -> None:
    """What ``streaming=True`` needs from the other options (at construction).

    Raises:
        ValueError: No packing, or no training shards in ``data_files``.
    """
    if not data.packing:
        raise ValueError("streaming=true streams packed rows; set packing=true with it")
    if _spec(data, data.train_split) is None:
        raise ValueError(
            f"streaming=true reads the training shards from data_files (a directory, glob or "
            f"files; or data_files.{data.train_split}=...), got data_files={data.data_files!r}"
        )


def _spec(data: CausalLMData, split: str | None) -> Any:
    files = data.data_files
    if isinstance(files, dict):
        return files.get(split) if split is not None else None
    return files if split == data.train_split else None


def setup_stream(data: CausalLMData) -> None:
    """Find and check the training shards; load, tokenize and pack the validation ones.

    Raises:
        FileNotFoundError: A shard path or glob that names no file.
        ValueError: A shuffle buffer that would not fit in memory
            (:func:`check_shuffle_buffer`), a truncated shard or one of another schema
            (``ShardError``, naming it), or shards with no row at all.
    """
    check_shuffle_buffer(data.shuffle_buffer, data.max_length, data.num_workers)
    shards = shard_files(_spec(data, data.train_split))
    if check_shards(shards, data.text_column) == 0:
        raise ValueError(
            f"the training stream is empty: its {len(shards)} shards ({shards[0]}, ...) hold no "
            "document; point data_files at shards with rows"
        )
    data.train_set = shards
    val_spec = _spec(data, data.val_split)
    if val_spec is None:
        return  # no validation (val_split=null)
    check_shards(shard_files(val_spec), data.text_column)
    splits = load_splits(data.dataset, None, {"validation": val_spec}, data.seed, data.num_train,
                         data.num_val, data.cache_dir)  # fmt: skip
    val = splits["validation"]
    if data.max_val_samples is not None:
        val = val.select(range(min(data.max_val_samples, len(val))))
    check_columns(val, {"text": data.text_column}, f"dataset {data.dataset!r}")
    data.val_set = data._pack(data._tokenize(val), "validation")  # pyright: ignore[reportPrivateUsage]


ROW_OVERHEAD = 512  # bytes a buffered row takes besides its tokens (its tensor's objects)


def available_memory() -> int | None:
    """The bytes of memory this machine has available (``MemAvailable``; ``None`` where
    ``/proc/meminfo`` does not say)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_shuffle_buffer(rows: int, max_length: int, num_workers: int) -> None:
    """Refuse a shuffle buffer that would take more than half the machine's available memory.

    Each reader (every DataLoader worker, or the rank itself) fills its own buffer of
    ``rows`` packed rows before its first batch: ``len(PACKED_KEYS)`` int64 arrays of
    ``max_length`` each, plus :data:`ROW_OVERHEAD`.

    Raises:
        ValueError: Naming the buffer's estimated size, the memory available and the
            largest buffer that fits.
    """
    available = available_memory()
    if available is None:
        return
    readers = max(1, num_workers)
    per_row = len(PACKED_KEYS) * max_length * 8 + ROW_OVERHEAD
    if rows * per_row * readers <= available // 2:
        return
    fits = available // 2 // (per_row * readers)
    raise ValueError(
        f"data.shuffle_buffer={rows} would hold {rows} rows of {max_length} tokens in each of "
        f"{readers} reader(s) (max(1, num_workers)): about {_size(rows * per_row * readers)}, "
        f"more than half the {_size(available)} of memory available; use at most {fits} "
        "(a few hundred to a few thousand rows shuffle a stream well)"
    )


def _size(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.1f} GiB" if num_bytes >= 2**30 else f"{num_bytes / 2**20:.0f} MiB"


class _Encode:
    """Texts to whole token-id lists with the data module's tokenizer (picklable for workers)."""

    def __init__(self, tokenizer: Any, kwargs: dict[str, Any]) -> None:
        self.tokenizer, self.kwargs = tokenizer, kwargs

    def __call__(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer(texts, **self.kwargs)["input_ids"]


def stream_loader(data: CausalLMData) -> StatefulDataLoader:
    """The training loader: this rank's :class:`ShardStream` in a ``StatefulDataLoader``
    (batches of exactly ``batch_size`` rows; ``num_workers`` readers per rank)."""
    initialized = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if initialized else (0, 1)
    stream = ShardStream(
        data.train_set,
        data.text_column,
        _Encode(data.tokenizer, data._tokenizer_kwargs(pad=False)),  # pyright: ignore[reportPrivateUsage]
        data.max_length,
        data.tokenizer.pad_token_id,
        data.packing_policy,
        data.seed,
        data.shuffle_buffer,
        rank,
        world,
    )
    return StatefulDataLoader(
        stream,
        batch_size=data.batch_size,
        drop_last=True,
        num_workers=data.num_workers,
        collate_fn=data.collate,
    )
