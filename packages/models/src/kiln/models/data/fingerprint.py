"""What a run trains and validates on, as every checkpoint records it (entry ``"data"``),
and what changed since.

Local files (a CSV, JSON Lines, Parquet or Arrow shards) are recorded one by one: path, size,
XXH3-128 of the bytes (kiln's checkpoint checksum; a 402 MB Parquet file hashes at 6-9 GB/s
from the page cache and 0.9-3.4 GB/s once evicted, on one core here: seconds for a 10 GB
corpus, once per process) and, for Parquet, the rows its footer counts (under 1 ms, but a
footer and a size alone miss an edit that keeps both). Data no local file holds (the Hub,
kiln's generated data) is recorded as the ``datasets`` fingerprint of the prepared split.
Each split also records the rows the run uses. A resume compares the two: a file added,
removed or changed, another fingerprint or another row count is refused by name, unless the
data module was made with ``allow_changed=True`` (kiln-train: ``data.allow_changed=true``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch.distributed as dist

VERSION = 1
ROLES = {"train": "training", "validation": "validation"}
"""The splits a run reads, and their words in a message."""


class DataChangedError(ValueError):
    """The data differs from what the checkpoint a run resumes from was trained on."""


def file_record(path: Path, role: str) -> dict[str, Any]:
    """One local file: the split it feeds (``train``, ``validation``), its size, its bytes'
    checksum, and its rows where its format says them without reading the data (Parquet's
    footer)."""
    from kiln.core.checkpoints.checksum import checksum_of

    rows = None
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_metadata(path).num_rows
    return {"split": role, "size": path.stat().st_size, "checksum": checksum_of(path), "rows": rows}


def local_files(data: Any) -> dict[str, list[Path]]:
    """The local files that feed each split (``train``, ``validation``): a stream's training
    shards as it found them, ``data_files`` resolved as ``datasets`` resolves it, or the one
    file ``dataset`` names (validation held out of the training files counts as training).
    Remote files are left to the split's ``datasets`` fingerprint."""
    from datasets.data_files import resolve_pattern, sanitize_patterns

    from kiln.models.data.sources import LOCAL_FORMATS

    roles = {getattr(data, "train_split", "train"): "train"}
    if getattr(data, "val_split", None) is not None:
        roles.setdefault(data.val_split, "validation")
    found: dict[str, list[Path]] = {}
    if getattr(data, "streaming", False) and isinstance(data.train_set, list):
        found["train"] = [Path(p).absolute() for p in data.train_set]
    specs = getattr(data, "data_files", None)
    dataset = str(getattr(data, "dataset", ""))
    if specs is None and Path(dataset).suffix in LOCAL_FORMATS:
        specs = dataset  # a local file as the dataset: datasets' "train" split
    for split, patterns in (sanitize_patterns(specs) if specs else {}).items():
        role = roles.get(split)
        if role is None or role in found:
            continue
        files = set()
        for pattern in patterns:
            if "://" in str(pattern):
                continue
            try:
                files |= {Path(f).absolute() for f in resolve_pattern(str(pattern), os.getcwd())}
            except FileNotFoundError:
                continue  # the data module's own loading names it
        found[role] = sorted(files)
    return found


def fingerprint(data: Any) -> dict[str, Any]:
    """The record of what ``data`` (a set-up kiln data module) feeds the run: ``files`` by
    path, and per split (``train``, ``validation``) its ``rows`` and, for data no local file
    holds, its ``datasets`` fingerprint."""
    found = local_files(data)
    files = {str(p): file_record(p, role) for role, paths in found.items() for p in paths}
    prepared = getattr(data, "_raw", None) or (None, None)
    splits: dict[str, dict[str, Any]] = {}
    for role, split in zip(ROLES, prepared, strict=True):
        held = [r for r in files.values() if r["split"] == role]
        rows = len(split) if split is not None else None
        if rows is None and held and all(r["rows"] is not None for r in held):
            rows = sum(r["rows"] for r in held)
        fp = None if files or split is None else getattr(split, "_fingerprint", None)
        if rows is not None or fp is not None:
            splits[role] = {"rows": rows, "fingerprint": fp}
    return {"version": VERSION, "files": files, "splits": splits}


def changes(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between a checkpoint's data record and the data's now, one phrase each
    (``"training file /c/a.parquet changed (1200 -> 1304 bytes; 10 -> 12 rows)"``)."""
    out = []
    before, after = saved.get("files") or {}, now.get("files") or {}
    for path in sorted(before.keys() | after.keys()):
        old, new = before.get(path), after.get(path)
        split = str((new or old or {}).get("split"))
        what = f"{ROLES.get(split, 'data')} file {path}"
        if old is None:
            out.append(f"{what} added{_rows(None, new)}")
        elif new is None:
            out.append(f"{what} removed{_rows(old, None)}")
        elif (old["size"], old["checksum"]) != (new["size"], new["checksum"]):
            size = (
                f"{old['size']} -> {new['size']} bytes"
                if old["size"] != new["size"]
                else f"same size ({old['size']} bytes), other content"
            )
            out.append(f"{what} changed ({size}{_rows(old, new)})")
    for role, word in ROLES.items():
        old, new = (saved.get("splits") or {}).get(role), (now.get("splits") or {}).get(role)
        if old is None or new is None:
            continue
        if old["fingerprint"] != new["fingerprint"]:
            out.append(
                f"the {word} split's datasets fingerprint {old['fingerprint']} -> "
                f"{new['fingerprint']}"
            )
        if None not in (old["rows"], new["rows"]) and old["rows"] != new["rows"]:
            out.append(f"{word} rows {old['rows']} -> {new['rows']}")
    return out


def _rows(old: dict[str, Any] | None, new: dict[str, Any] | None) -> str:
    """Where the files' format says their rows: `` (10 rows)`` for a file added or removed,
    ``; 10 -> 12 rows`` for one changed."""
    a, b = (r.get("rows") if r else None for r in (old, new))
    if old is None or new is None:
        n = b if old is None else a
        return "" if n is None else f" ({n} row{'' if n == 1 else 's'})"
    return "" if a is None or b is None else f"; {a} -> {b} rows"


def refusal(found: list[str], where: str) -> str:
    """The one-line refusal of a resume on changed data: what changed, and the ways on."""
    return (
        f"the data changed since {where} was written: {'; '.join(found)}. Resuming would "
        "train on other data than the run it continues: restore the data, train into a new "
        "directory, or go on deliberately with data.allow_changed=true (the data module's "
        "allow_changed=True)"
    )


def _rank_zero() -> bool:
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


class DataIdentity:
    """The ``"data"`` checkpoint entry of a kiln data module (``DataModule.checkpoint_state``):
    saves :func:`fingerprint`; a resume compares and refuses a change
    (:class:`DataChangedError`) unless the module allows it. :attr:`changes` holds what a
    resume found changed."""

    def __init__(self, data: Any) -> None:
        self.data = data
        self.changes: list[str] = []

    def state_dict(self) -> dict[str, Any]:
        return self.data.data_fingerprint()

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Compare the checkpoint's record with the data now.

        Raises:
            DataChangedError: They differ and the data module was not made with
                ``allow_changed=True``; the message names each change.
        """
        self.changes = changes(saved, self.data.data_fingerprint())
        if not self.changes:
            return
        if not self.data.allow_changed:
            raise DataChangedError(refusal(self.changes, "the checkpoint this run resumes from"))
        if _rank_zero():
            print(
                f"resuming on changed data (allow_changed=true): {'; '.join(self.changes)}",
                flush=True,
            )

    def load_missing(self, path: Any) -> None:
        """A checkpoint that records no data (written before kiln recorded it): resume, and
        say so once."""
        if _rank_zero():
            print(
                f"checkpoint {path} does not record the data it was trained on: resuming "
                "without comparing it with the data now",
                flush=True,
            )
