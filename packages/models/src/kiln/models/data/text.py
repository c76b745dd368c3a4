"""Text data modules: classification and causal language modelling.

The raw text is tokenized once with ``map(batched=True)`` (cached on disk under a
fingerprint of the data, the tokenizer and the padding) and handed out as tensors with
``with_format("torch")``. The default padding is a fixed ``max_length``, so every batch
has the same shape and a compiled model never recompiles; ``padding="buckets"`` pads
each batch to the smallest of a few lengths instead (at most one graph per bucket).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import datasets
import torch
from datasets.fingerprint import Hasher

from kiln.models.contract import TextModel, require
from kiln.models.data.base import IGNORE_INDEX, DataModule, default_cache_dir
from kiln.models.data.packing import PackingStats, check_policy, default_policy, pack_documents
from kiln.models.data.sources import (
    GENERATED_SENTIMENT,
    check_columns,
    check_labels,
    first_bad_label,
    hold_out,
    load_splits,
    num_classes,
    rows_of,
)
from kiln.models.data.stream_setup import check_streaming, setup_stream, stream_loader

PADDINGS = ("max_length", "buckets")


class TextData(DataModule):
    """Raw loading, tokenization and padding shared by the text data modules.

    Subclasses say which columns they read (``_columns``) and how a batch of raw rows
    becomes model inputs and ``labels`` (``_encode``). Arguments: see
    ``TextClassificationData``.
    """

    def __init__(
        self,
        dataset: str = GENERATED_SENTIMENT,
        subset: str | None = None,
        data_files: str | list | dict | None = None,
        train_split: str = "train",
        val_split: str | None = "validation",
        text_column: str = "text",
        tokenizer: Any = None,
        max_length: int = 64,
        padding: str = "max_length",
        buckets: tuple[int, ...] = (16, 32, 64, 128, 256, 512),
        batch_size: int = 32,
        val_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
        num_train: int = 4000,
        num_val: int = 1000,
        max_train_samples: int | None = None,
        max_val_samples: int | None = None,
        val_fraction: float = 0.1,
        cache_dir: str | None = None,
        allow_changed: bool = False,
    ) -> None:
        super().__init__(batch_size, val_batch_size, num_workers, seed, allow_changed)
        if padding not in PADDINGS:
            raise ValueError(f"padding={padding!r} is not valid; choose one of: {PADDINGS}")
        if max_length < 2:
            raise ValueError(f"max_length={max_length!r} must be >= 2")
        self.dataset = dataset
        self.subset = subset
        self.data_files = data_files
        self.train_split = train_split
        self.val_split = val_split
        self.text_column = text_column
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.padding = padding
        self.buckets = tuple(sorted({b for b in buckets if b < max_length} | {max_length}))
        self.num_train = num_train
        self.num_val = num_val
        self.max_train_samples = max_train_samples
        self.max_val_samples = max_val_samples
        self.val_fraction = val_fraction
        self.cache_dir = cache_dir
        self._raw: tuple[datasets.Dataset, datasets.Dataset] | None = None
        self._splits: datasets.DatasetDict | None = None  # as the source holds them
        if num_workers > 0:
            # Tokenizers' thread pool does not survive fork into DataLoader workers: keep it
            # off (unless the user chose) so workers never deadlock. Workers do not tokenize.
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    # -- raw data -------------------------------------------------------------------------
    def raw(self) -> tuple[datasets.Dataset, datasets.Dataset]:
        """The untokenized (train, validation) datasets, loaded once."""
        if self._raw is None:
            self._splits = load_splits(
                self.dataset, self.subset, self.data_files, self.seed, self.num_train,
                self.num_val, self.cache_dir,
            )  # fmt: skip
            train, val = hold_out(
                self._splits, self.dataset, self.train_split, self.val_split,
                self.val_fraction, self.seed,
            )  # fmt: skip
            if self.max_train_samples is not None:
                train = train.select(range(min(self.max_train_samples, len(train))))
            if self.max_val_samples is not None:
                val = val.select(range(min(self.max_val_samples, len(val))))
            for split in (train, val):
                check_columns(split, self._columns(), f"dataset {self.dataset!r}")
            self._raw = (train, val)
        return self._raw

    def _columns(self) -> dict[str, str | None]:
        return {"text": self.text_column}

    # -- tokenizer ------------------------------------------------------------------------
    def attach(self, module: Any) -> None:
        """Use the model's tokenizer unless one was given, and check it fits the model.

        Raises:
            TypeError: No tokenizer was given and the model has none
                (:class:`kiln.models.contract.TextModel`).
        """
        if self.tokenizer is None:
            require(module, TextModel, type(self).__name__)
            self.tokenizer = module.tokenizer
        elif isinstance(self.tokenizer, str | Path):
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(str(self.tokenizer))
        vocab = getattr(module, "vocab_size", None)
        if vocab is not None and len(self.tokenizer) > vocab:
            raise ValueError(
                f"the tokenizer has {len(self.tokenizer)} tokens but the model's embedding has "
                f"{vocab}; use the model's tokenizer or config_overrides={{'vocab_size': "
                f"{len(self.tokenizer)}}}"
            )
        limit = getattr(module, "max_positions", None)
        if limit is not None and self.max_length > limit:
            raise ValueError(
                f"max_length={self.max_length} exceeds the model's {limit} positions; "
                f"use max_length <= {limit}"
            )
        if self.tokenizer.pad_token is None:  # GPT-2 style tokenizers have none
            self.tokenizer.pad_token = self.tokenizer.eos_token

    # -- tokenization ---------------------------------------------------------------------
    def _setup(self) -> None:
        if self.tokenizer is None:
            raise RuntimeError(
                "the data module has no tokenizer: pass tokenizer=... or attach it to a model "
                "(create_model(name, data=...))"
            )
        train, val = self.raw()
        self.train_set = self._tokenize(train)
        self.val_set = self._tokenize(val)

    def _tokenize(self, data: datasets.Dataset) -> datasets.Dataset:
        tok = self.tokenizer
        fingerprint = Hasher.hash(
            [data._fingerprint, type(self).__name__, tok.name_or_path, len(tok), self.max_length,
             self.padding, self._columns(), tok.pad_token_id, *self._encoding_options(), "v1"]
        )  # fmt: skip
        pad = self.padding == "max_length"

        def encode(rows: dict[str, list]) -> dict[str, list]:
            return self._encode(rows, pad)

        kwargs: dict[str, Any] = {}
        if not data.cache_files:  # in-memory data: map can only cache to a file we name
            cache = Path(self.cache_dir or default_cache_dir()) / "tokenized"
            cache.mkdir(parents=True, exist_ok=True)
            kwargs["cache_file_name"] = str(cache / f"{fingerprint}.arrow")
        encoded = data.map(
            encode,
            batched=True,
            remove_columns=data.column_names,
            new_fingerprint=fingerprint,
            desc="tokenizing",
            **kwargs,
        )
        return encoded.with_format("torch")

    def _encode(self, rows: dict[str, list], pad: bool) -> dict[str, list]:
        raise NotImplementedError

    def _encoding_options(self) -> list[Any]:
        """What else changes the encoded rows (part of the cache fingerprint)."""
        return []

    def _tokenizer_kwargs(self, pad: bool) -> dict[str, Any]:
        return {
            "truncation": True,
            "max_length": self.max_length,
            "padding": "max_length" if pad else False,
        }

    # -- batching -------------------------------------------------------------------------
    fixed_keys: tuple[str, ...] = ()
    """Keys whose rows already have one shape (not padded to the bucket length)."""

    def bucket_length(self, longest: int) -> int:
        """The padded length of a batch whose longest row has ``longest`` tokens."""
        return next(b for b in self.buckets if b >= longest)

    def collate(self, items: list[dict]) -> dict[str, torch.Tensor]:
        if self.padding == "max_length":
            return torch.utils.data.default_collate(items)
        length = self.bucket_length(max(len(item["input_ids"]) for item in items))
        pad_values = {
            "input_ids": self.tokenizer.pad_token_id,
            "labels": IGNORE_INDEX,
            "special_tokens_mask": 1,  # padding is never chosen for masking
        }
        batch = {}
        for key in items[0]:
            if items[0][key].ndim == 0 or key in self.fixed_keys:
                batch[key] = torch.stack([item[key] for item in items])
                continue
            value = pad_values.get(key, 0)
            batch[key] = torch.stack(
                [torch.nn.functional.pad(it[key], (0, length - len(it[key])), value=value)
                 for it in items]
            )  # fmt: skip
        return batch


class TextClassificationData(TextData):
    """Text (or text-pair) classification data.

    Defaults to kiln's generated sentiment data (``kiln/sentiment``, offline); any hub
    dataset (``glue/sst2``) or local csv/json/parquet file works with a column mapping.
    Batches hold ``input_ids``, ``attention_mask`` (``token_type_ids`` for BERT) and
    ``labels``.

    Args:
        dataset: See ``kiln.models.data.sources.load_raw``.
        text_column: The text column.
        text_pair_column: A second text column, for pair tasks (e.g. ``glue/mrpc``).
        label_column: The label column (integers, ``ClassLabel`` or strings).
        tokenizer: A tokenizer, a name or local directory, or ``None`` to take the model's.
        max_length: Token length rows are truncated (and by default padded) to.
        padding: ``max_length`` (one static shape) or ``buckets``.
        buckets: Bucket lengths for ``padding="buckets"`` (capped at ``max_length``).
        num_train: Generated training rows; num_val: generated validation rows.
        max_train_samples: Keep only the first N training rows (any dataset).
        **kwargs: See ``DataModule`` (batch sizes, workers, seed) and ``load_raw``.
    """

    def __init__(
        self,
        dataset: str = GENERATED_SENTIMENT,
        text_column: str = "text",
        text_pair_column: str | None = None,
        label_column: str = "label",
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset=dataset, text_column=text_column, **kwargs)
        self.text_pair_column = text_pair_column
        self.label_column = label_column
        self._num_labels: int | None = None

    def _columns(self) -> dict[str, str | None]:
        return {
            "text": self.text_column,
            "text_pair": self.text_pair_column,
            "label": self.label_column,
        }

    def _source_splits(self) -> list[tuple[datasets.Dataset, tuple[str, int | None]]]:
        """The training and validation splits as the source holds them, with where."""
        assert self._splits is not None, "raw() loads the splits first"
        return [
            (self._splits[split], rows_of(self.dataset, self.data_files, split))
            for split in (self.train_split, self.val_split)
            if split is not None and split in self._splits
        ]

    def raw(self) -> tuple[datasets.Dataset, datasets.Dataset]:
        if self._raw is None:
            train, val = super().raw()
            for data, where in self._source_splits():  # before training, naming the line
                check_labels(data, self.label_column, where)
            feature = train.features[self.label_column]
            if "float" in str(getattr(feature, "dtype", "")):  # an empty cell made them floats
                train = train.cast_column(self.label_column, datasets.Value("int64"))
                val = val.cast_column(self.label_column, datasets.Value("int64"))
            elif not isinstance(feature, datasets.ClassLabel) and "string" in str(feature.dtype):
                # String labels: one sorted mapping shared by both splits.
                names = sorted(set(train[self.label_column]) | set(val[self.label_column]))
                label = datasets.ClassLabel(names=names)
                train = train.cast_column(self.label_column, label)
                val = val.cast_column(self.label_column, label)
            self._raw = (train, val)
        return self._raw

    @property
    def num_labels(self) -> int:
        """Classes in the data (the ``ClassLabel`` size, or the largest label + 1)."""
        if self._num_labels is None:
            self._num_labels = num_classes(self.raw(), self.label_column)
        return self._num_labels

    @property
    def label_names(self) -> list[str] | None:
        feature = self.raw()[0].features[self.label_column]
        return list(feature.names) if isinstance(feature, datasets.ClassLabel) else None

    def attach(self, module: Any) -> None:
        super().attach(module)
        if module.num_labels < self.num_labels:
            first = (
                first_bad_label(data, self.label_column, where, module.num_labels)
                for data, where in self._source_splits()
            )
            beyond = next((f" (first: {bad})" for bad in first if bad is not None), "")
            raise ValueError(
                f"the model has num_labels={module.num_labels} but the data "
                f"({self.dataset!r}, column {self.label_column!r}) has labels "
                f"0..{self.num_labels - 1}{beyond}; use num_labels={self.num_labels} (or None "
                "to infer)"
            )

    def _encode(self, rows: dict[str, list], pad: bool) -> dict[str, list]:
        pairs = rows[self.text_pair_column] if self.text_pair_column else None
        encoded = dict(self.tokenizer(rows[self.text_column], pairs, **self._tokenizer_kwargs(pad)))
        encoded["labels"] = rows[self.label_column]
        return encoded


class CausalLMData(TextData):
    """Causal language-modelling data: one padded sequence per row, or packed rows.

    ``labels`` are the ``input_ids`` with padding set to -100, so the loss and
    ``num_items`` count only real tokens. Defaults to the text of kiln's generated data.

    With ``packing=True`` documents are tokenized whole (no truncation) and packed into rows
    of exactly ``max_length`` tokens (``kiln.models.data.packing``): rows carry
    ``position_ids`` that restart per document and ``document_ids`` from which the model
    builds a block-diagonal causal mask, so a packed batch trains as its documents would one
    per row. Training and validation sets are both packed.

    Args:
        dataset: See ``kiln.models.data.sources.load_raw``.
        text_column: The text column.
        packing: Pack documents into full rows instead of one padded document per row.
        packing_policy: What happens to a document at a row's end: ``best_fit`` (never
            split one that fits a row, and fill the rows as tightly as best-fit decreasing
            does; not with ``streaming``), ``whole`` (pad the row and start the document on
            the next one; only documents longer than a row are split) or ``carry`` (split
            it, the remainder starts the next row: its first token loses its label and it
            loses the context before it). ``None``: ``best_fit``, or ``whole`` with
            ``streaming``.
        max_val_tokens: Validate on the validation documents' first N tokens (documents in
            order; with packing the last one is cut there). ``None``: all of them.
        streaming: Stream the training rows from the shards ``data_files`` names (tokenized
            and packed on the fly; ``kiln.models.data.streaming``) instead of loading them.
        shuffle_buffer: With ``streaming``, rows each reader draws from at random.
        **kwargs: See ``TextClassificationData``; ``seed`` also seeds the packing order.
    """

    def __init__(
        self,
        packing: bool = False,
        packing_policy: str | None = None,
        streaming: bool = False,
        shuffle_buffer: int = 64,
        max_val_tokens: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        packing_policy = default_policy(packing_policy, streaming)
        check_policy(packing_policy, streaming)
        if max_val_tokens is not None and max_val_tokens < 1:
            raise ValueError(f"max_val_tokens={max_val_tokens!r} must be >= 1 (or null: all)")
        if packing and self.padding != "max_length":
            raise ValueError(
                f"packing=true fills every row to max_length, so padding={self.padding!r} "
                "does not apply; use padding=max_length with packing"
            )
        self.packing = packing
        self.packing_policy = packing_policy
        self.streaming = streaming
        self.shuffle_buffer = shuffle_buffer
        self.max_val_tokens = max_val_tokens
        if streaming:
            check_streaming(self)
        self.packing_stats: dict[str, PackingStats] = {}
        """What packing did to each set (``train``, ``validation``), once set up."""

    def attach(self, module: Any) -> None:
        """See ``TextData.attach``; with packing, the model must take a document mask.

        Raises:
            TypeError: ``packing=True`` and the model has no ``check_packing``.
        """
        super().attach(module)
        if self.packing:
            check = getattr(module, "check_packing", None)
            if check is None:
                raise TypeError(
                    f"packing=true needs a model that takes packed rows (position_ids and a "
                    f"document mask, e.g. kiln.models.HFCausalLM); {type(module).__name__} "
                    "does not define check_packing(); set packing=false"
                )
            check()

    def _setup(self) -> None:
        if self.streaming:
            setup_stream(self)
            return
        if self.max_val_tokens is not None:  # tokenize only what validation keeps
            train, val = self.raw()
            self._raw = (train, val.select(range(self._documents_within(val))))
        super()._setup()
        if self.packing:
            self.train_set = self._pack(self.train_set, "train")
            self.val_set = self._pack(self.val_set, "validation")

    def train_dataloader(self) -> Any:
        """See ``DataModule.train_dataloader``; with ``streaming``, a ``StatefulDataLoader``
        over this rank's stream."""
        if not self.streaming:
            return super().train_dataloader()
        self.setup()
        return stream_loader(self)

    def val_dataloader(self) -> Any:
        """See ``DataModule.val_dataloader``; ``None`` for a stream without validation shards."""
        self.setup()
        return None if self.val_set is None else super().val_dataloader()

    def _documents_within(self, val: datasets.Dataset, chunk: int = 32) -> int:
        """How many of ``val``'s first documents it takes to reach ``max_val_tokens``."""
        kwargs = {**self._tokenizer_kwargs(pad=False), "return_attention_mask": False}
        budget, tokens = self.max_val_tokens, 0
        if budget is None:
            return len(val)
        for start in range(0, len(val), chunk):
            texts = val[start : start + chunk][self.text_column]
            for i, ids in enumerate(self.tokenizer(texts, **kwargs)["input_ids"]):
                tokens += len(ids)
                if tokens >= budget:
                    return start + i + 1
        return len(val)

    def _pack(self, documents: datasets.Dataset, split: str) -> datasets.Dataset:
        ids = documents.with_format("numpy")[:]["input_ids"]  # arrays, not lists of ints
        if split == "validation" and self.max_val_tokens is not None:
            ids = _first_tokens(ids, self.max_val_tokens)
        arrays, stats = pack_documents(
            ids, self.max_length, self.tokenizer.pad_token_id, self.packing_policy, self.seed
        )
        self.packing_stats[split] = stats
        return datasets.Dataset.from_dict(dict(arrays)).with_format("torch")

    def _encoding_options(self) -> list[Any]:
        return [self.packing]

    def _tokenizer_kwargs(self, pad: bool) -> dict[str, Any]:
        if self.packing:  # whole documents: packing splits them, never truncation
            return {"truncation": False, "padding": False, "verbose": False}
        return super()._tokenizer_kwargs(pad)

    def _encode(self, rows: dict[str, list], pad: bool) -> dict[str, list]:
        encoded = self.tokenizer(rows[self.text_column], **self._tokenizer_kwargs(pad))
        if self.packing:
            return {"input_ids": encoded["input_ids"]}
        encoded = {k: v for k, v in encoded.items() if k in ("input_ids", "attention_mask")}
        encoded["labels"] = [
            [tok if keep else IGNORE_INDEX for tok, keep in zip(ids, mask, strict=True)]
            for ids, mask in zip(encoded["input_ids"], encoded["attention_mask"], strict=True)
        ]
        return encoded


def _first_tokens(documents: Any, budget: int) -> list[Any]:
    """The documents' first ``budget`` tokens, in order (the last document cut there)."""
    kept, left = [], budget
    for ids in documents:
        if left <= 0:
            break
        kept.append(ids[:left])
        left -= len(kept[-1])
    return kept


class LossBaseline:
    """A ``fit`` callback for causal LMs: at the end of the run, the last validation loss per
    token beside ln(vocabulary), what a model that guesses uniformly scores (one line, rank 0).

    In a config: ``callbacks.lm_baseline: {_target_: kiln.models.data.text.LossBaseline}``.
    """

    def __init__(self) -> None:
        self.fit: Any = None
        self.loss: float | None = None

    def on_loop_start(self, fit: Any) -> None:
        self.fit = fit

    def on_validation_metrics(self, metrics: dict[str, float]) -> None:
        self.loss = metrics.get("val/loss", self.loss)

    def on_fit_end(self) -> None:
        vocab = getattr(getattr(self.fit, "module", None), "vocab_size", None)
        if self.loss is None or not vocab or self.fit.fabric.global_rank != 0:
            return
        print(
            f"val/loss {self.loss:.3f} nats per token; a uniform guess over the {vocab}-token "
            f"vocabulary scores ln({vocab}) = {math.log(vocab):.3f}",
            flush=True,
        )
