"""The checksums that prove a checkpoint's bytes are the ones kiln wrote.

A checkpoint's checksum guards against damage (a truncated copy, a flipped bit, a file
swapped for another), not against an attacker who rewrites ``run.json`` too. So kiln takes
xxHash's XXH3-128, which hashes at memory speed (about 20 GB/s on one core here, against
1.5 GB/s for sha256 with the CPU's SHA extensions): a 7B model's 84 GB of weights and AdamW
state cost seconds, not a minute, per save and per resume.

A recorded checksum names its algorithm (``xxh3_128:<32 hex digits>``). A bare hex string
is a sha256, which run directories written by earlier kiln releases hold: those are still
verified, as sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xxhash

ALGORITHM = "xxh3_128"
"""The algorithm of every checksum kiln records now."""

_LEGACY = "sha256"  # a bare hex digest: what run.json and checksums.json held before
_HASHERS: dict[str, Callable[[], Any]] = {ALGORITHM: xxhash.xxh3_128, _LEGACY: hashlib.sha256}
_BLOCK = 1 << 20


def new_hasher() -> Any:
    """An empty hasher of :data:`ALGORITHM` (``update`` it, then :func:`recorded`)."""
    return _HASHERS[ALGORITHM]()


def recorded(hasher: Any, algorithm: str = ALGORITHM) -> str:
    """How ``hasher``'s checksum is recorded: ``xxh3_128:<hex>`` (sha256: the bare hex digest
    earlier releases wrote)."""
    digest = hasher.hexdigest()
    return digest if algorithm == _LEGACY else f"{algorithm}:{digest}"


def algorithm_of(checksum: str) -> str:
    """The algorithm a recorded checksum was taken with (a bare hex digest: sha256).

    Raises:
        ValueError: It names an algorithm kiln does not know.
    """
    name, sep, _ = checksum.partition(":")
    if not sep:
        return _LEGACY
    if name not in _HASHERS:
        raise ValueError(
            f"checksum {checksum!r} names algorithm {name!r}; kiln knows {', '.join(_HASHERS)}"
        )
    return name


def checksum_of(path: Path, algorithm: str = ALGORITHM) -> str:
    """The checksum of a file's bytes; of a directory (a sharded checkpoint), one checksum
    over each file's path (relative, then a NUL) and bytes, in path order; as
    :func:`recorded` writes it."""
    hasher = _HASHERS[algorithm]()
    directory = path.is_dir()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if directory else [path]
    for file in files:
        if directory:
            hasher.update(str(file.relative_to(path)).encode() + b"\0")
        with open(file, "rb") as handle:
            for block in iter(lambda h=handle: h.read(_BLOCK), b""):
                hasher.update(block)
    return recorded(hasher, algorithm)


def matches(path: Path, checksum: str) -> bool:
    """Whether ``path``'s bytes have the recorded ``checksum`` (taken with its algorithm)."""
    return checksum_of(path, algorithm_of(checksum)) == checksum


CHECKSUMS = "checksums.json"
"""A checkpoint directory's own list of its files' checksums (written last)."""


def write_checksums(directory: Path) -> None:
    """Record the checksum of every file of a checkpoint directory in ``checksums.json``
    (flushed to disk). Called by rank 0 once every rank's files are written."""
    sums = {
        str(p.relative_to(directory)): checksum_of(p)
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != CHECKSUMS
    }
    with open(directory / CHECKSUMS, "w") as handle:
        handle.write(json.dumps(sums, indent=1))
        handle.flush()
        os.fsync(handle.fileno())


def checksum_damage(directory: Path) -> str | None:
    """Why a checkpoint directory's files do not match its ``checksums.json``, naming the
    file, or ``None`` when every file does."""
    listed = directory / CHECKSUMS
    if not listed.is_file():
        return f"it has no {CHECKSUMS} (the save did not finish)"
    try:
        sums = json.loads(listed.read_text())
    except ValueError:
        return f"its {CHECKSUMS} is unreadable"
    for name, expected in sums.items():
        path = directory / name
        if not path.is_file():
            return f"its file {path} is missing"
        if not matches(path, expected):
            return f"its file {path} does not match the checksum in {listed}"
    return None
