"""A checkpoint directory belongs to one run.

``<dir>/run.json`` names the run (``run_id``) and lists the checkpoints it wrote, oldest first,
each with the sha256 of its bytes (recorded after the file is complete and renamed into
place). Only listed files are ever resumed from or pruned; a file whose bytes no longer match
its checksum is damaged. ``run.json`` itself is replaced atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

RUN_FILE = "run.json"
CHECKPOINT_NAME = re.compile(r"^step-(\d+)\.ckpt$")


class CheckpointDirError(RuntimeError):
    """The checkpoint directory cannot hold this run: another run's, or not writable."""


class DamagedCheckpointError(RuntimeError):
    """A checkpoint's bytes do not match its checksum, or it cannot be read back."""


@dataclass
class RunFile:
    """What ``run.json`` holds."""

    run_id: str
    checkpoints: dict[str, str] = field(default_factory=dict)  # name -> sha256, oldest first
    # files saved under their own name (e.g. best.ckpt): checked, never pruned or resumed from
    named: dict[str, str] = field(default_factory=dict)


def new_run_id() -> str:
    """A fresh run id (16 hex digits)."""
    return uuid.uuid4().hex[:16]


def read_run_file(directory: str | Path) -> RunFile | None:
    """The ``run.json`` of ``directory``, or ``None`` if it has none."""
    path = Path(directory) / RUN_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        return RunFile(
            str(data["run_id"]), dict(data.get("checkpoints", {})), dict(data.get("named", {}))
        )
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointDirError(
            f"{path} is not a kiln run file ({error}); it should hold "
            '{"run_id": ..., "checkpoints": {...}}: restore it or use a new checkpoint_dir'
        ) from None


def write_run_file(directory: str | Path, run: RunFile) -> None:
    """Replace ``directory``'s ``run.json`` atomically (temp file, fsync, rename)."""
    directory = Path(directory)
    text = json.dumps(
        {"run_id": run.run_id, "checkpoints": run.checkpoints, "named": run.named}, indent=1
    )
    fd, temp = tempfile.mkstemp(prefix=".run.json.", dir=directory)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, directory / RUN_FILE)


def sha256_of(path: Path) -> str:
    """The sha256 of a checkpoint file's bytes (of every file, by name, for a directory)."""
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        if path.is_dir():
            digest.update(str(file.relative_to(path)).encode() + b"\0")
        with open(file, "rb") as handle:
            for block in iter(lambda h=handle: h.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def check_writable(directory: str | Path) -> None:
    """Create ``directory`` and write a file in it, or fail naming it (before training)."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(prefix=".write-test-", dir=directory):
            pass
    except OSError as error:
        raise CheckpointDirError(
            f"trainer.checkpoint_dir={str(directory)!r} is not writable "
            f"({error.strerror or error}): set it to a directory this job can create and write"
        ) from None


def holds_checkpoints(directory: Path) -> bool:
    """Whether ``directory`` holds any file named like a checkpoint."""
    if not directory.is_dir():
        return False
    return any(CHECKPOINT_NAME.match(p.name) for p in directory.iterdir())


def claim(directory: str | Path, resume: str | None, resumed_run_id: str | None) -> str:
    """Make ``directory`` the run's checkpoint directory; return the run's id.

    A fresh run (``resume=None``) gets a new id and refuses a directory holding any
    checkpoint. A resumed run keeps the id of the checkpoint it loaded (or the directory's,
    for ``resume='auto'`` with nothing to load) and refuses a directory whose ``run.json``
    names another run that has checkpoints there.

    Raises:
        CheckpointDirError: The directory holds another run's checkpoints; the message names
            it and the choices.
    """
    directory = Path(directory)
    recorded = read_run_file(directory)
    if resume is None:
        run_id = new_run_id()
    else:
        run_id = resumed_run_id or (recorded.run_id if recorded else new_run_id())
    if recorded is not None and recorded.run_id == run_id:
        return run_id  # this run's own directory
    others = recorded is not None and (recorded.checkpoints or holds_checkpoints(directory))
    if others or (resume is None and holds_checkpoints(directory)):
        owner = f"run {recorded.run_id}" if recorded else "another run (no run.json)"
        how = (
            "continue that run with trainer.resume='auto', or give this run a new "
            "trainer.checkpoint_dir"
            if resume is None
            else f"give the resumed run {run_id} a new trainer.checkpoint_dir"
        )
        raise CheckpointDirError(
            f"trainer.checkpoint_dir={str(directory)!r} holds the checkpoints of {owner}; a "
            f"checkpoint directory belongs to one run: {how}"
        )
    write_run_file(directory, RunFile(run_id))
    return run_id
