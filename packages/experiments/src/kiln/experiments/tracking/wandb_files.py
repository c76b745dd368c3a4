"""Read an offline W&B run back from its ``.wandb`` file, without uploading it.

W&B writes a run as a transaction log (LevelDB log format: 32 KiB blocks of CRC-checked
chunks, each record a ``wandb_internal_pb2.Record``, after a ``:W&B`` header with a format
version). W&B has no public reader of it (its Python ``datastore`` went with wandb-core; a
reader for a local API is in the works upstream), so this is a small one: enough to find the
last step a run holds (a resumed job backfills exactly the steps after it), to check that
every logged step is there, or to look at an offline run before ``wandb sync``.

It reads the format versions it knows (:data:`KNOWN_VERSIONS`) and refuses any other file
loudly (:class:`WandbFormatError`), never guessing: ``tests/experiments/test_wandb_format.py``
writes a real offline run with the installed wandb and reads it back, so a W&B release that
changes the format fails that test, not a resumed job.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_FILE_HEADER = struct.Struct("<4sHB")  # ident b":W&B", magic 0xBEE1, version
_CHUNK_HEADER = struct.Struct("<IHB")  # crc32, length, type
_BLOCK = 32768
KNOWN_VERSIONS = (0,)
"""The ``.wandb`` format versions this reader knows (the header's last byte)."""


class WandbFormatError(ValueError):
    """A ``.wandb`` file this reader does not know: not a W&B transaction log, or a format
    version W&B changed to (the message names it and the installed wandb)."""


_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def find_run_file(path: str | Path) -> Path:
    """The ``.wandb`` file of a run directory (or of the only run below ``path``).

    Raises:
        FileNotFoundError: ``path`` holds no ``.wandb`` file, or several (a resumed job's
            attempts: read them all with :func:`find_run_files`).
    """
    files = find_run_files(path)
    if len(files) != 1:
        raise FileNotFoundError(f"expected exactly one .wandb file under {path}, found {files}")
    return files[0]


def find_run_files(path: str | Path) -> list[Path]:
    """The ``.wandb`` files of the one run at ``path``, oldest attempt first.

    A job re-run into its directory continues its W&B run, and each attempt writes its own
    ``offline-run-<time>-<id>/run-<id>.wandb``: together they are the run. ``path`` is a
    ``.wandb`` file, a run directory or a job directory.

    Raises:
        FileNotFoundError: No ``.wandb`` file below ``path``.
        ValueError: The files belong to more than one run (e.g. a sweep directory).
    """
    path = Path(path)
    if path.is_file():
        return [path]
    found = {f.resolve(): f for f in path.rglob("*.wandb")}  # latest-run links to one of them
    files = sorted(found.values(), key=lambda f: (f.parent.name, f.stat().st_mtime))
    if not files:
        raise FileNotFoundError(f"no .wandb file under {path}")
    ids = sorted({f.stem.removeprefix("run-") for f in files})
    if len(ids) > 1:
        raise ValueError(
            f"{path} holds {len(ids)} W&B runs ({', '.join(ids)}); give one job's or run's "
            "directory"
        )
    return files


def _chunks(data: bytes) -> Iterator[tuple[int, bytes]]:
    pos = _FILE_HEADER.size
    while pos + _CHUNK_HEADER.size <= len(data):
        left_in_block = _BLOCK - pos % _BLOCK
        if left_in_block < _CHUNK_HEADER.size:  # block trailer is zero padding
            pos += left_in_block
            continue
        crc, length, kind = _CHUNK_HEADER.unpack_from(data, pos)
        if kind == 0 and length == 0:
            return  # preallocated, never-written tail
        body = data[pos + _CHUNK_HEADER.size : pos + _CHUNK_HEADER.size + length]
        if zlib.crc32(bytes([kind]) + body) & 0xFFFFFFFF != crc:
            raise ValueError(f"corrupt chunk at byte {pos}: bad checksum")
        yield kind, body
        pos += _CHUNK_HEADER.size + length


def read_records(path: str | Path) -> Iterator[Any]:
    """Every ``Record`` protobuf of a run, in order: of its ``.wandb`` file, or of every
    attempt's file of a resumed job (:func:`find_run_files`). An attempt that was killed may
    end in a half-written record; the records before it count, as for W&B's own sync."""
    files = find_run_files(path)
    for i, file in enumerate(files):
        yield from _file_records(file, complete=i == len(files) - 1)


def _file_records(path: Path, complete: bool = True) -> Iterator[Any]:
    """The records of one ``.wandb`` file; not ``complete``: stop quietly at a damaged end."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    if len(data) < _FILE_HEADER.size and not complete:
        return  # a killed attempt that never wrote its header
    ident, magic, version = _FILE_HEADER.unpack_from(data, 0)
    if ident != b":W&B" or magic != 0xBEE1:
        raise WandbFormatError(f"{path} is not a W&B transaction log")
    if version not in KNOWN_VERSIONS:
        import wandb

        raise WandbFormatError(
            f"{path} is in .wandb format version {version} (wandb {wandb.__version__}); kiln "
            f"reads version {', '.join(map(str, KNOWN_VERSIONS))}: update "
            "kiln/experiments/tracking/wandb_files.py, or install the wandb kiln pins"
        )
    pending = b""
    try:
        for kind, body in _chunks(data):
            if kind in (_FULL, _FIRST):
                pending = body
            else:
                pending += body
            if kind in (_FULL, _LAST):
                record = wandb_internal_pb2.Record()
                record.ParseFromString(pending)
                yield record
    except WandbFormatError:
        raise
    except (ValueError, DecodeError):  # a bad checksum, a record cut short
        if complete:
            raise


def _item_key(item: Any) -> str:
    return "/".join(item.nested_key) if item.nested_key else item.key


def read_history(path: str | Path) -> list[dict[str, Any]]:
    """The run's history: one dict per ``log`` call (``_step`` plus the logged values), over
    every attempt of a resumed job."""
    rows = []
    for record in read_records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append({_item_key(i): json.loads(i.value_json) for i in record.history.item})
    return rows


def last_logged_step(files: list[Path], step_key: str) -> int | None:
    """The highest ``step_key`` in the rows of ``files`` (a killed run's file may end in a
    half-written record: the rows before it count), or ``None`` when there is none.

    Raises:
        WandbFormatError: A file is in a format this reader does not know (guessing would
            log steps twice, or not at all).
    """
    last = None
    for path in files:
        for record in _file_records(path, complete=False):
            if record.WhichOneof("record_type") != "history":
                continue
            for item in record.history.item:
                if _item_key(item) == step_key:
                    step = json.loads(item.value_json)
                    last = step if last is None else max(last, step)
    return last


def read_summary(path: str | Path) -> dict[str, Any]:
    """The run's final summary (the last value of every key written to it)."""
    summary: dict[str, Any] = {}
    for record in read_records(path):
        if record.WhichOneof("record_type") == "summary":
            for item in record.summary.update:
                summary[_item_key(item)] = json.loads(item.value_json)
            for item in record.summary.remove:
                summary.pop(_item_key(item), None)
    return summary


def read_run(path: str | Path) -> dict[str, Any]:
    """Name, group, job type, tags, config (with later updates) and exit code of the run."""
    info: dict[str, Any] = {}
    for record in read_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            info.update(
                id=run.run_id,
                name=run.display_name,
                group=run.run_group,
                job_type=run.job_type,
                tags=list(run.tags),
                project=run.project,
            )
            info.setdefault("config", {}).update(
                {u.key: json.loads(u.value_json) for u in run.config.update}
            )
        elif kind == "config":  # config.update() after the run started
            info.setdefault("config", {}).update(
                {u.key: json.loads(u.value_json) for u in record.config.update}
            )
        elif kind == "exit":
            info["exit_code"] = record.exit.exit_code
    return info


def main(argv: list[str] | None = None) -> None:
    """``python -m kiln.experiments.tracking.wandb_files <run or job dir>``: print a run (all
    attempts of a resumed job's run as one)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("path", help="an offline-run-* directory, a job directory or a .wandb file")
    parser.add_argument("--history", action="store_true", help="print every logged row")
    args = parser.parse_args(argv)
    info = read_run(args.path)
    info["attempts"] = len(find_run_files(args.path))  # a resumed job's files, read as one
    print(json.dumps({k: v for k, v in info.items() if k != "config"}, indent=2))
    summary = {k: v for k, v in read_summary(args.path).items() if not k.startswith("_")}
    print(json.dumps(summary, indent=2))
    if args.history:
        for row in read_history(args.path):
            print(json.dumps({k: v for k, v in row.items() if not k.startswith("_")}))


if __name__ == "__main__":
    main()
