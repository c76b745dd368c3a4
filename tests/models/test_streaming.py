"""``data.streaming=true``: packed rows streamed from shards, split over ranks and workers
without overlap, and a loader position that continues exactly; bad shards named up front."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from kiln.models.data import CausalLMData
from kiln.models.data.shards import ShardError
from kiln.models.data.streaming import ShardStream

LENGTH = 16


def documents(count: int = 40) -> list[str]:
    """Document ``k`` is ``k + 1`` words long (1..count: some span rows, some share one)."""
    return [" ".join([f"d{k}"] * (k % 23 + 1)) for k in range(count)]


def encode(texts: list[str]) -> list[list[int]]:
    """Every word of document ``dK`` is token ``K + 1``: a piece names its document."""
    return [[int(word[1:]) + 1 for word in text.split()] for text in texts]


def write_shards(directory: Path, texts: list[str], per_shard: int = 7) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(0, len(texts), per_shard):
        path = directory / f"train-{i // per_shard:05d}.parquet"
        pq.write_table(pa.table({"text": texts[i : i + per_shard]}), path)
        paths.append(path)
    return paths


def write_arrow(path: Path, texts: list[str], form: str) -> Path:
    """``texts`` as an Arrow IPC ``file`` (Feather v2) or ``stream`` (HF datasets' format)."""
    table = pa.table({"text": pa.array(texts, pa.string()), "n": list(range(len(texts)))})
    new = pa.ipc.new_file if form == "file" else pa.ipc.new_stream
    with pa.OSFile(str(path), "wb") as sink, new(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=3):  # several record batches
            writer.write_batch(batch)
    return path


def stream(files: list[Path], rank: int = 0, world: int = 1, **kwargs) -> ShardStream:
    options = {"policy": "carry", "seed": 3, "shuffle_buffer": 8, **kwargs}
    return ShardStream(files, "text", encode, LENGTH, 0, rank=rank, world_size=world, **options)


def loader(data: ShardStream, workers: int) -> StatefulDataLoader:
    return StatefulDataLoader(data, batch_size=2, drop_last=True, num_workers=workers)


def pieces(rows: list[dict]) -> list[tuple[int, int]]:
    """(document, tokens) of every piece of the rows, checking its positions restart at 0."""
    out = []
    for row in rows:
        ids, docs, positions = (
            row[k].tolist() for k in ("input_ids", "document_ids", "position_ids")
        )
        start = 0
        for i in range(1, LENGTH + 1):
            if i == LENGTH or docs[i] != docs[start]:
                if docs[start] != -1:
                    assert positions[start:i] == list(range(i - start))
                    assert len(set(ids[start:i])) == 1
                    out.append((ids[start] - 1, i - start))
                start = i
    return out


def first_pass(data: ShardStream) -> list[dict]:
    """Rows up to the first that holds a document of the second pass: with a buffer of 1,
    every token of the first pass is in them."""
    rows = []
    for row in data:
        rows.append(row)
        if data.epoch == 1:
            return rows
    raise AssertionError("unreachable: the stream is endless")


class Reader(ShardStream):
    """Reader ``slot`` of ``slots``, as a DataLoader worker of a rank sees itself."""

    def __init__(self, files: list[Path], slot: int, slots: int) -> None:
        self.fixed = (slot, slots)
        super().__init__(files, "text", encode, LENGTH, 0, seed=3, shuffle_buffer=1)

    def _reader(self) -> tuple[int, int]:
        return self.fixed


def test_one_pass_packs_every_token_of_every_document_in_order(tmp_path: Path) -> None:
    """Unshuffled (a buffer of 1), one reader, one shard: the rows hold each document's
    tokens in order, split only at row ends (carry), positions restarting per piece."""
    texts = documents()
    files = write_shards(tmp_path, texts, per_shard=len(texts))
    got: list[tuple[int, int]] = []
    for doc, size in pieces(first_pass(stream(files, shuffle_buffer=1))):
        if got and got[-1][0] == doc:  # the rest of a document a row end split
            got[-1] = (doc, got[-1][1] + size)
        else:
            got.append((doc, size))
    assert got[: len(texts)] == [(k, k % 23 + 1) for k in range(len(texts))]


@pytest.mark.parametrize("slots", [2, 4])
def test_readers_share_no_document_and_miss_none(tmp_path: Path, slots: int) -> None:
    """Readers (ranks x workers) of one pass: disjoint documents, all of them together."""
    files = write_shards(tmp_path, documents())
    seen = [{doc for doc, _ in pieces(first_pass(Reader(files, s, slots)))} for s in range(slots)]
    for i, mine in enumerate(seen):
        for other in seen[i + 1 :]:
            assert not mine & other
    assert set().union(*seen) == set(range(40))


@pytest.mark.parametrize(("world", "workers"), [(1, 0), (1, 2), (2, 1)])
@pytest.mark.parametrize("policy", ["carry", "whole"])
def test_a_loader_continues_from_its_state_exactly(
    tmp_path: Path, world: int, workers: int, policy: str
) -> None:
    """A fresh loader given the state after 7 batches yields the batches the uninterrupted
    one yields next, across passes (shard order, buffer, open row, generator all carried);
    one not given it does not."""
    files = write_shards(tmp_path, documents())
    rank = world - 1
    uninterrupted = loader(stream(files, rank, world, policy=policy), workers)
    batches = iter(uninterrupted)
    for _ in range(7):
        next(batches)
    state = uninterrupted.state_dict()
    want = [next(batches) for _ in range(60)]  # about four passes over the documents
    resumed = loader(stream(files, rank, world, policy=policy), workers)
    resumed.load_state_dict(state)
    got = iter(resumed)
    for expected in want:
        batch = next(got)
        for key in expected:
            assert batch[key].equal(expected[key]), key
    fresh = iter(loader(stream(files, rank, world, policy=policy), workers))
    assert not all(next(fresh)["input_ids"].equal(b["input_ids"]) for b in want[:3])


@pytest.mark.parametrize(("form", "suffix"), [("file", ".arrow"), ("stream", ".arrow"),
                                             ("file", ".feather")])  # fmt: skip
def test_arrow_shards_stream_as_parquet_shards_do(tmp_path: Path, form: str, suffix: str) -> None:
    from kiln.models.data.shards import check_shards, read_texts, shard_files

    texts = documents()
    parquet = write_shards(tmp_path / "parquet", texts)
    (tmp_path / "arrow").mkdir()
    arrow = [
        write_arrow(tmp_path / "arrow" / f"{p.stem}{suffix}", read_texts(p, "text"), form)
        for p in parquet
    ]
    assert shard_files(str(tmp_path / "arrow")) == arrow
    assert check_shards(arrow, "text") == len(texts)
    assert [read_texts(p, "text") for p in arrow] == [read_texts(p, "text") for p in parquet]
    assert pieces(first_pass(stream(arrow))) == pieces(first_pass(stream(parquet)))


# -- bad input, named before anything trains ------------------------------------------------
def data_module(data_files, **kwargs) -> CausalLMData:
    options = {"dataset": "parquet", "packing": True, "streaming": True, "val_split": None,
               "max_length": LENGTH, "tokenizer": object(), **kwargs}  # fmt: skip
    return CausalLMData(data_files=data_files, **options)


def test_a_missing_shard_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"shard '.*nowhere-\*\.parquet' does not exist"):
        data_module(str(tmp_path / "nowhere-*.parquet")).setup()


def test_a_truncated_shard_is_named(tmp_path: Path) -> None:
    (path,) = write_shards(tmp_path, documents(5))
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(ShardError, match=f"shard {path} is not a readable Parquet file"):
        data_module(str(tmp_path)).setup()


@pytest.mark.parametrize("form", ["file", "stream"])
def test_a_truncated_arrow_shard_is_named(tmp_path: Path, form: str) -> None:
    path = write_arrow(tmp_path / "train-0.arrow", documents(12), form)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # cut inside a batch
    with pytest.raises(ShardError, match=f"shard {path} is not a readable Arrow IPC file"):
        data_module(str(tmp_path), dataset="arrow").setup()


def test_an_arrow_shard_without_the_text_column_is_named(tmp_path: Path) -> None:
    path = tmp_path / "train-0.feather"
    table = pa.table({"content": ["a b"]})
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    with pytest.raises(ShardError, match=f"shard {path} has no column 'text'"):
        data_module(str(path), dataset="arrow").setup()


def test_a_shard_of_another_schema_is_named(tmp_path: Path) -> None:
    path = tmp_path / "train-0.parquet"
    pq.write_table(pa.table({"content": ["a b"]}), path)
    with pytest.raises(ShardError, match=f"shard {path} has no column 'text'"):
        data_module(str(path)).setup()
    pq.write_table(pa.table({"text": [1, 2]}), path)
    with pytest.raises(ShardError, match="column 'text' holds int64, not text"):
        data_module(str(path)).setup()


def test_a_bad_json_line_is_named_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({"text": "a b"}) + "\n\n" + '{"text": "cut off')
    with pytest.raises(ShardError, match=f"shard {path}, line 3: not JSON"):  # the file's line
        data_module(str(path), dataset="json").setup()
    path.write_text(json.dumps({"body": "a b"}) + "\n")
    with pytest.raises(ShardError, match=f"shard {path}, line 1: no text in column 'text'"):
        data_module(str(path), dataset="json").setup()


def test_a_bad_json_line_inside_a_shard_is_named_before_training(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    lines = [json.dumps({"text": f"document {i}"}) for i in range(6)]
    lines[3] = '{"text": "cut'  # neither the first nor the last line
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ShardError, match=f"shard {path}, line 4: not JSON"):
        data_module(str(path), dataset="json").setup()
    lines[3] = json.dumps({"text": None})
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ShardError, match=f"shard {path}, line 4: no text in column 'text'"):
        data_module(str(path), dataset="json").setup()


def test_a_null_text_inside_a_parquet_or_arrow_shard_is_named_before_training(
    tmp_path: Path,
) -> None:
    texts = [f"document {i}" for i in range(10)]
    texts[7] = None  # in the second of two row groups
    path = tmp_path / "train-0.parquet"
    pq.write_table(pa.table({"text": pa.array(texts, pa.string())}), path, row_group_size=5)
    assert pq.read_metadata(path).num_row_groups == 2
    with pytest.raises(ShardError, match=f"shard {path}, row 7: column 'text' is empty"):
        data_module(str(path)).setup()
    nested = tmp_path / "nested" / "train-0.parquet"  # two leaf columns before the text's
    nested.parent.mkdir()
    meta = pa.array([{"source": "a", "line": i} for i in range(10)])
    table = pa.table({"meta": meta, "text": pa.array(texts, pa.string())})
    pq.write_table(table, nested, row_group_size=5)
    with pytest.raises(ShardError, match=f"shard {nested}, row 7: column 'text' is empty"):
        data_module(str(nested)).setup()
    arrow = tmp_path / "arrow" / "train-0.arrow"
    arrow.parent.mkdir()
    table = pa.table({"text": pa.array(texts, pa.string())})
    with pa.OSFile(str(arrow), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    with pytest.raises(ShardError, match=f"shard {arrow}, row 7: column 'text' is empty"):
        data_module(str(arrow), dataset="arrow").setup()


def test_an_empty_stream_is_refused(tmp_path: Path) -> None:
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "train-0.parquet")
    with pytest.raises(ValueError, match="the training stream is empty"):
        data_module(str(tmp_path)).setup()


def test_streaming_options_are_checked_when_built(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_length=1 must be >= 2"):
        data_module(str(tmp_path), max_length=1)
    with pytest.raises(ValueError, match="streaming=true streams packed rows; set packing=true"):
        data_module(str(tmp_path), packing=False)
    with pytest.raises(
        ValueError, match="streaming=true reads the training shards from data_files"
    ):
        data_module(None)
