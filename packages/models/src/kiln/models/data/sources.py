"""Where raw datasets come from: kiln's generated data, the HF hub, or local files."""

from __future__ import annotations

from pathlib import Path

import datasets

from kiln.models.data.base import default_cache_dir
from kiln.models.data.sentiment import LABELS, generate_sentiment

GENERATED_SENTIMENT = "kiln/sentiment"
LOCAL_FORMATS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def load_generated_sentiment(
    num_train: int, num_val: int, seed: int, cache_dir: str | Path | None = None
) -> datasets.DatasetDict:
    """kiln's generated sentiment data, saved once to disk so later maps are cached."""
    root = Path(cache_dir or default_cache_dir()) / f"sentiment-v1-{num_train}-{num_val}-{seed}"
    if not (root / "dataset_dict.json").exists():
        features = datasets.Features(
            {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=list(LABELS))}
        )
        rows = generate_sentiment(num_train + num_val, seed)
        full = datasets.Dataset.from_dict(rows, features=features)
        splits = datasets.DatasetDict(
            train=full.select(range(num_train)),
            validation=full.select(range(num_train, num_train + num_val)),
        )
        splits.save_to_disk(str(root))
    return datasets.load_from_disk(str(root))


def load_raw(
    dataset: str,
    subset: str | None = None,
    data_files: str | list | dict | None = None,
    train_split: str = "train",
    val_split: str | None = "validation",
    val_fraction: float = 0.1,
    seed: int = 0,
    num_train: int = 4000,
    num_val: int = 1000,
    cache_dir: str | Path | None = None,
) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Load a (train, validation) pair of raw datasets.

    Args:
        dataset: ``kiln/sentiment`` (generated offline), a hub name (``glue/sst2`` is read
            as name ``glue``, subset ``sst2`` unless ``subset`` is given), a builder
            (``csv``, ``json``, ``parquet``) with ``data_files``, or a local file path.
        subset: The hub dataset's configuration name.
        data_files: Files for the ``csv``/``json``/``parquet`` builders (a path, a list, or
            a ``{split: path}`` dict).
        train_split: The split to train on.
        val_split: The split to validate on; when the data has no such split (or it is
            ``None``), ``val_fraction`` of the training split is held out.
        val_fraction: The held-out fraction when there is no validation split.
        seed: Seeds the generated data and the held-out split.
        num_train: Rows of generated training data (``kiln/sentiment`` only).
        num_val: Rows of generated validation data (``kiln/sentiment`` only).
        cache_dir: Where generated data is saved.
    """
    if dataset == GENERATED_SENTIMENT:
        splits = load_generated_sentiment(num_train, num_val, seed, cache_dir)
    elif Path(dataset).suffix in LOCAL_FORMATS and data_files is None:
        path = Path(dataset)
        if not path.exists():
            raise FileNotFoundError(f"dataset file {str(path)!r} does not exist")
        splits = datasets.load_dataset(LOCAL_FORMATS[path.suffix], data_files=str(path))
    elif dataset in set(LOCAL_FORMATS.values()):
        if data_files is None:
            raise ValueError(f"dataset={dataset!r} needs data_files=<path, list or dict of split>")
        splits = datasets.load_dataset(dataset, data_files=data_files)
    else:
        splits = _load_hub(dataset, subset)
    if train_split not in splits:
        raise ValueError(
            f"dataset {dataset!r} has no split {train_split!r}; splits found: {list(splits)}"
        )
    train = splits[train_split]
    if val_split is not None and val_split in splits:
        return train, splits[val_split]
    held_out = train.train_test_split(test_size=val_fraction, seed=seed)
    return held_out["train"], held_out["test"]


def _load_hub(dataset: str, subset: str | None) -> datasets.DatasetDict:
    if subset is None and dataset.count("/") == 1:
        name, maybe_subset = dataset.split("/")
        try:  # the ``glue/sst2`` shorthand first, then an ``owner/name`` repository
            return datasets.load_dataset(name, maybe_subset)
        except (FileNotFoundError, ValueError, ConnectionError):
            pass
    return datasets.load_dataset(dataset, subset)


def check_columns(data: datasets.Dataset, columns: dict[str, str | None], what: str) -> None:
    """Fail, naming the columns found, when a mapped column is missing."""
    for role, column in columns.items():
        if column is not None and column not in data.column_names:
            raise ValueError(
                f"{what}: the {role} column {column!r} is not in the data; columns found: "
                f"{data.column_names} (map yours with {role}_column=...)"
            )
