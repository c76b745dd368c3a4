"""Where raw datasets come from: kiln's generated data, the HF hub, or local files."""

from __future__ import annotations

from pathlib import Path

import datasets

from kiln.models.data.base import default_cache_dir
from kiln.models.data.generated import NER_LABELS, generate_ner, generate_qa, generate_reverse
from kiln.models.data.sentiment import LABELS, generate_sentiment

GENERATED_SENTIMENT = "kiln/sentiment"
GENERATED_QA = "kiln/qa"
GENERATED_NER = "kiln/ner"
GENERATED_REVERSE = "kiln/reverse"
LOCAL_FORMATS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def _generated_features(name: str) -> datasets.Features:
    string, label = datasets.Value("string"), datasets.ClassLabel
    return {
        GENERATED_SENTIMENT: lambda: datasets.Features(
            {"text": string, "label": label(names=list(LABELS))}
        ),
        GENERATED_QA: lambda: datasets.Features(
            {
                "context": string,
                "question": string,
                "answer": string,
                "answer_start": datasets.Value("int64"),
            }
        ),
        GENERATED_NER: lambda: datasets.Features(
            {
                "tokens": datasets.Sequence(string),
                "tags": datasets.Sequence(label(names=list(NER_LABELS))),
            }
        ),
        GENERATED_REVERSE: lambda: datasets.Features({"source": string, "target": string}),
    }[name]()


GENERATORS = {
    GENERATED_SENTIMENT: generate_sentiment,
    GENERATED_QA: generate_qa,
    GENERATED_NER: generate_ner,
    GENERATED_REVERSE: generate_reverse,
}
"""kiln's generated datasets by name (offline): ``dataset=<name>`` in any text data module."""


def load_generated(
    name: str, num_train: int, num_val: int, seed: int, cache_dir: str | Path | None = None
) -> datasets.DatasetDict:
    """One of kiln's generated datasets, saved once to disk so later maps are cached."""
    for option, value in (("num_train", num_train), ("num_val", num_val)):
        if value < 1:
            raise ValueError(
                f"{option}={value!r} is not valid: {name} needs at least 1 row "
                "in each split (use an integer >= 1)"
            )
    slug = name.split("/")[1]
    root = Path(cache_dir or default_cache_dir()) / f"{slug}-v1-{num_train}-{num_val}-{seed}"
    if not (root / "dataset_dict.json").exists():
        rows = GENERATORS[name](num_train + num_val, seed)
        full = datasets.Dataset.from_dict(rows, features=_generated_features(name))
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
    """Load a (train, validation) pair of raw datasets (:func:`load_splits`, then
    :func:`hold_out`).

    Args:
        dataset: One of kiln's generated datasets (``kiln/sentiment``, ``kiln/qa``,
            ``kiln/ner``, ``kiln/reverse``: offline), a hub name (``glue/sst2`` is read
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
        num_train: Rows of generated training data (kiln's generated datasets only).
        num_val: Rows of generated validation data (kiln's generated datasets only).
        cache_dir: Where generated data is saved.
    """
    splits = load_splits(dataset, subset, data_files, seed, num_train, num_val, cache_dir)
    return hold_out(splits, dataset, train_split, val_split, val_fraction, seed)


def load_splits(
    dataset: str,
    subset: str | None = None,
    data_files: str | list | dict | None = None,
    seed: int = 0,
    num_train: int = 4000,
    num_val: int = 1000,
    cache_dir: str | Path | None = None,
) -> datasets.DatasetDict:
    """The splits of a raw dataset as its source holds them (see :func:`load_raw`)."""
    if dataset in GENERATORS:
        splits = load_generated(dataset, num_train, num_val, seed, cache_dir)
    elif Path(dataset).suffix in LOCAL_FORMATS and data_files is None:
        path = Path(dataset)
        if not path.exists():
            raise FileNotFoundError(f"dataset file {str(path)!r} does not exist")
        splits = _load_files(LOCAL_FORMATS[path.suffix], str(path))
    elif dataset in set(LOCAL_FORMATS.values()):
        if data_files is None:
            raise ValueError(f"dataset={dataset!r} needs data_files=<path, list or dict of split>")
        splits = _load_files(dataset, data_files)
    else:
        splits = _load_hub(dataset, subset)
    return splits


def _load_files(builder: str, data_files: str | list | dict) -> datasets.DatasetDict:
    try:
        return datasets.load_dataset(builder, data_files=data_files)
    except (ValueError, datasets.exceptions.DatasetGenerationError):
        # datasets says 'Instruction "train" corresponds to no data!' of a file without rows
        for file in _file_list(data_files):
            if _has_no_rows(Path(file), builder):
                raise ValueError(
                    f"dataset file {str(file)!r} holds no rows: give it a header line "
                    "(e.g. text,label) and at least one row"
                    if builder == "csv"
                    else f"dataset file {str(file)!r} holds no rows: give it at least one row"
                ) from None
        raise


def _file_list(data_files: str | list | dict) -> list[str]:
    if isinstance(data_files, str):
        return [data_files]
    values = data_files.values() if isinstance(data_files, dict) else data_files
    return [f for v in values for f in _file_list(v)]


def _has_no_rows(path: Path, builder: str) -> bool:
    if not path.is_file():
        return False
    if builder == "parquet":
        return path.stat().st_size == 0
    with path.open("rb") as f:
        lines = [line for line, _ in zip(f, range(2), strict=False) if line.strip()]
    return len(lines) <= (1 if builder == "csv" else 0)  # a CSV's first line is its header


def hold_out(
    splits: datasets.DatasetDict,
    dataset: str,
    train_split: str = "train",
    val_split: str | None = "validation",
    val_fraction: float = 0.1,
    seed: int = 0,
) -> tuple[datasets.Dataset, datasets.Dataset]:
    """The (train, validation) pair of ``splits`` (see :func:`load_raw`)."""
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


def rows_of(
    dataset: str, data_files: str | list | dict | None, split: str
) -> tuple[str, int | None]:
    """What holds ``split``'s rows, for an error message, and the file line of its row 0
    (``None`` where rows are not lines of one file)."""
    file = None
    if data_files is None and Path(dataset).suffix in LOCAL_FORMATS:
        file = dataset
    elif isinstance(data_files, str):
        file = data_files
    elif isinstance(data_files, dict) and isinstance(data_files.get(split), str):
        file = data_files[split]
    if file is None:
        return f"dataset {dataset!r} (split {split!r})", None
    # a CSV's row 0 is its line 2 (after the header); .json may be one array, not lines
    return f"dataset file {file!r}", {".csv": 2, ".jsonl": 1}.get(Path(file).suffix)


def first_bad_label(
    data: datasets.Dataset,
    column: str,
    where: tuple[str, int | None],
    num_classes: int | None = None,
) -> str | None:
    """The first row whose label a classifier cannot train on (an empty cell, a negative
    or non-integer class index, or with ``num_classes`` one the model lacks), said as
    ``"<source>, column '<column>': line 3 (row 1) has label -1"``; ``None`` if none.

    Args:
        data: Rows as their source holds them (row ``i`` is the source's ``i``-th row).
        column: The label column (class indices, or class names).
        where: :func:`rows_of` of ``data``.
        num_classes: The model's classes, if known.
    """
    source, first_line = where
    names = _holds_names(data, column)
    for i, value in enumerate(data[column]):
        if value is None:
            problem = "has no label (an empty cell)"
        elif names:
            continue
        elif isinstance(value, float) and not value.is_integer():
            problem = f"has label {value}, not an integer"
        elif value < 0 or (num_classes is not None and value >= num_classes):
            problem = f"has label {int(value)}"
        else:
            continue
        row = f"line {first_line + i} (row {i})" if first_line is not None else f"row {i}"
        return f"{source}, column {column!r}: {row} {problem}"
    return None


def check_labels(data: datasets.Dataset, column: str, where: tuple[str, int | None]) -> None:
    """Fail at :func:`first_bad_label`, saying what is valid.

    Raises:
        ValueError: One line naming the source, the column, the first bad row and what is
            valid.
    """
    bad = first_bad_label(data, column, where)
    if bad is not None:
        valid = (
            "every row needs a class name"
            if _holds_names(data, column)
            else ("labels are class indices (integers >= 0) or class names")
        )
        raise ValueError(f"{bad}; {valid}")


def num_classes(splits: tuple[datasets.Dataset, ...], column: str) -> int:
    """Classes of the label ``column`` over ``splits``: the ``ClassLabel``'s size (the first
    split's feature), else the largest class index + 1."""
    feature = splits[0].features[column]
    if isinstance(feature, datasets.ClassLabel):
        return len(feature.names)  # its num_classes (an init-only field to type checkers)
    return int(max(label for split in splits for label in split[column])) + 1


def _holds_names(data: datasets.Dataset, column: str) -> bool:
    return "string" in str(getattr(data.features[column], "dtype", ""))
