"""Local text shards (Parquet, Arrow IPC or JSON Lines) for a stream: found, checked and read
by row.

Every shard is checked before training (:func:`check_shards`): a missing file, a Parquet file
whose footer is cut off, an Arrow file cut anywhere, a text column that is absent or not text,
a null text (Parquet: from the footer's null counts, then the one row group that has it;
Arrow: the column's null count), and every line of a JSON Lines file (each is parsed: about
5 s per GB on a 2-core VM, against 0.001 s for a Parquet shard's footer). A Parquet file
written without statistics is checked for nulls when the stream reaches them.
"""

from __future__ import annotations

import glob
import json
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

PARQUET = (".parquet",)
ARROW = (".arrow", ".feather")  # Arrow IPC: the file format (Feather v2) or the stream format
JSON_LINES = (".jsonl", ".json")
SHARD_SUFFIXES = PARQUET + ARROW + JSON_LINES


class ShardError(ValueError):
    """A shard that cannot be read as text documents (its path, and row where there is one)."""


def shard_files(spec: str | Sequence[str]) -> list[Path]:
    """The shard files ``spec`` names: a directory (its ``*.parquet``, ``*.arrow``,
    ``*.feather``, ``*.jsonl`` and ``*.json`` files), a glob, a file, or a list of these;
    sorted, each once.

    Raises:
        FileNotFoundError: A path or glob that names no shard.
    """
    files: list[Path] = []
    for item in [spec] if isinstance(spec, str) else list(spec):
        path = Path(item).expanduser()
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix in SHARD_SUFFIXES)
        else:
            found = sorted(Path(p) for p in glob.glob(str(path)))
        if not found:
            raise FileNotFoundError(
                f"shard {item!r} does not exist (no file, and no {'/'.join(SHARD_SUFFIXES)} "
                "file in it if a directory); give a directory, a glob or files of shards"
            )
        files += [p for p in found if p not in files]
    for path in files:
        if path.suffix not in SHARD_SUFFIXES:
            raise ShardError(
                f"shard {path} is not a Parquet, Arrow or JSON Lines file; valid suffixes: "
                f"{', '.join(SHARD_SUFFIXES)}"
            )
    return files


def check_shards(files: Sequence[Path], text_column: str) -> int:
    """Check every shard can be read for ``text_column``; return the rows they hold.

    Raises:
        ShardError: A truncated or unreadable shard, or one without a text column.
    """
    checks = {**dict.fromkeys(PARQUET, _check_parquet), **dict.fromkeys(ARROW, _check_arrow)}
    return sum(checks.get(p.suffix, _check_json_lines)(p, text_column) for p in files)


def _check_parquet(path: Path, column: str) -> int:
    try:
        meta = pq.read_metadata(path)
    except (OSError, pa.ArrowException) as error:
        raise ShardError(
            f"shard {path} is not a readable Parquet file (truncated or damaged: {error})"
        ) from None
    _check_schema(path, meta.schema.to_arrow_schema(), column)
    # the text's leaf column among the footer's (nested columns before it count each leaf)
    index = next(i for i in range(meta.num_columns) if meta.schema.column(i).path == column)
    first = 0  # the first row of each row group
    for group in range(meta.num_row_groups):
        stats = meta.row_group(group).column(index).statistics
        if stats is not None and stats.has_null_count and stats.null_count:
            texts = pq.ParquetFile(path).read_row_group(group, columns=[column]).column(0)
            _raise_on_null(path, column, texts, first)
        first += meta.row_group(group).num_rows
    return meta.num_rows


def _check_arrow(path: Path, column: str) -> int:
    table = _arrow_table(path)  # memory-mapped: reading every batch finds a cut anywhere
    _check_schema(path, table.schema, column)
    _raise_on_null(path, column, table.column(column), 0)
    return table.num_rows


def _raise_on_null(path: Path, column: str, texts: pa.ChunkedArray, first: int) -> None:
    """Name the first null in ``texts`` (rows ``first``... of the shard), if there is one."""
    if texts.null_count:
        row = first + pc.index(pc.is_null(texts), True).as_py()  # pyright: ignore[reportAttributeAccessIssue]
        raise ShardError(f"shard {path}, row {row}: column {column!r} is empty (null)")


def _arrow_table(path: Path) -> pa.Table:
    """An Arrow IPC shard, memory-mapped: the file format (Feather v2, ``pa.ipc.new_file``) or
    the stream format (``pa.ipc.new_stream``; HF datasets' own ``.arrow`` files)."""
    try:
        with pa.memory_map(str(path)) as source:
            try:
                return pa.ipc.open_file(source).read_all()
            except pa.ArrowInvalid:  # no file footer: a stream, or a file cut short
                source.seek(0)
                return pa.ipc.open_stream(source).read_all()
    except (OSError, pa.ArrowException) as error:
        raise ShardError(
            f"shard {path} is not a readable Arrow IPC file or stream (truncated or damaged: "
            f"{error})"
        ) from None


def _check_schema(path: Path, schema: pa.Schema, column: str) -> None:
    if column not in schema.names:
        raise ShardError(
            f"shard {path} has no column {column!r} (it has {schema.names}); set "
            "data.text_column to its text column"
        )
    kind = schema.field(column).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise ShardError(f"shard {path}: column {column!r} holds {kind}, not text")


def _json_lines(path: Path) -> list[tuple[int, bytes]]:
    """(line index, line) of every non-blank line of a JSON Lines shard."""
    with path.open("rb") as handle:
        return [(row, line) for row, line in enumerate(handle) if line.strip()]


def _check_json_lines(path: Path, column: str) -> int:
    lines = _json_lines(path)
    for row, line in lines:
        document_text(line, path, row, column)
    return len(lines)


def document_text(line: bytes | str, path: Path, row: int, column: str) -> str:
    """The text of one JSON Lines row.

    Raises:
        ShardError: The line is no JSON object with a string ``column``.
    """
    try:
        record = json.loads(line)
    except ValueError as error:
        raise ShardError(
            f"shard {path}, line {row + 1}: not JSON (a truncated shard?): {error}"
        ) from None
    text = record.get(column) if isinstance(record, dict) else None
    if not isinstance(text, str):
        raise ShardError(
            f"shard {path}, line {row + 1}: no text in column {column!r} (the row has "
            f"{sorted(record) if isinstance(record, dict) else type(record).__name__})"
        )
    return text


def read_texts(path: Path, column: str) -> list[str]:
    """Every document's text in a shard, in order (a bad JSON line fails naming it)."""
    if path.suffix in PARQUET + ARROW:
        try:
            if path.suffix in PARQUET:
                texts = pq.read_table(path, columns=[column]).column(column).to_pylist()
            else:
                texts = _arrow_table(path).column(column).to_pylist()
        except (OSError, pa.ArrowException, KeyError) as error:
            raise ShardError(f"shard {path} could not be read: {error}") from None
        for row, text in enumerate(texts):
            if not isinstance(text, str):
                raise ShardError(f"shard {path}, row {row}: column {column!r} is empty (null)")
        return texts
    return [document_text(line, path, row, column) for row, line in _json_lines(path)]
