"""Sharded checkpoints (``trainer.strategy=fsdp``): a directory written by every rank.

``step-<N>.ckpt/`` holds torch distributed checkpoint's files (``__<rank>_0.distcp`` per
rank: its shards of the model and optimizer state, and ``.metadata``), ``meta.pt`` (the
plain values and the other objects' state, from rank 0) and ``checksums.json``: the
checksum of every other file, written last, so a damaged file is named by path.
``checkpoint.py`` stages the directory under a temporary name and renames it into place once
complete, exactly as it does a single file. Nobody gathers the whole model: not to save, not
to resume, and not to export (:func:`load_sharded_weights` reads the shards into a plain
module's own tensors, in one process).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch

from kiln.core.checkpoints.checksum import checksum_of, matches

CHECKSUMS = "checksums.json"


def write_checksums(directory: Path) -> None:
    """Record the checksum of every file of a sharded checkpoint in ``checksums.json``
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
    """Why a sharded checkpoint's files do not match its ``checksums.json``, naming the
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


def restore_stateful(objects: dict[str, Any], loaded: dict[str, Any]) -> None:
    """Load what Fabric's sharded load handed back as state dicts into the objects.

    Fabric's ``ModelParallelStrategy`` restores the model and optimizer itself but puts the
    saved state dict of any other object (scheduler, callbacks) in its place in the dict
    it was given, instead of loading it.
    """
    for name, obj in objects.items():
        got = loaded.get(name)
        if (
            got is not obj
            and isinstance(got, dict)
            and callable(getattr(obj, "load_state_dict", None))
        ):
            obj.load_state_dict(got)


def check_same_layout(path: Path, sharded_run: bool, strategy: str) -> None:
    """Refuse a checkpoint whose layout the run's strategy cannot load, naming both.

    A sharded checkpoint (a directory) resumes into an FSDP run; a single-file one (DDP or
    one device) into a run that is not sharded. ``kiln-export`` and ``kiln-eval`` read both.

    Raises:
        IsADirectoryError: ``path`` is a directory but no checkpoint (see
            ``checkpoint_paths``).
        ValueError: The layouts differ.
    """
    from kiln.core.checkpoints.paths import check_not_a_plain_directory

    check_not_a_plain_directory(path)
    sharded_checkpoint = path.is_dir()
    if sharded_checkpoint == sharded_run:
        return
    if sharded_checkpoint:
        raise ValueError(
            f"checkpoint {path} is sharded (written by trainer.strategy=fsdp) but this run "
            f"uses trainer.strategy={strategy}: resume it with trainer.strategy=fsdp, or "
            "kiln-export it and start a new run from the exported weights"
        )
    raise ValueError(
        f"checkpoint {path} is one file (written by trainer.strategy=ddp or one device) but "
        "this run uses trainer.strategy=fsdp: resume it with trainer.strategy=ddp (or auto), "
        "or kiln-export it and start a new run from the exported weights"
    )


def load_sharded_weights(module: torch.nn.Module, path: str | Path, key: str = "model") -> None:
    """Read a sharded checkpoint's model weights into ``module`` (not sharded), in place.

    One process, no process group: torch distributed checkpoint reads each shard straight
    into the module's own tensors (``state_dict()`` shares them), so memory holds one copy
    of the model. Every weight of the module must be in the checkpoint.

    Raises:
        RuntimeError: The checkpoint does not fit the module; the message names both.
    """
    from torch.distributed.checkpoint.api import CheckpointException

    # torch types its checkpoint_id as PathLike[Unknown]
    from torch.distributed.checkpoint.state_dict_loader import (
        load as dcp_load,  # pyright: ignore[reportUnknownVariableType]
    )

    state = module.state_dict()
    try:
        with warnings.catch_warnings():  # that it loads in one process is the point
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp_load({key: state}, checkpoint_id=str(path), no_dist=True)
    except (CheckpointException, RuntimeError, ValueError) as error:
        raise RuntimeError(
            f"checkpoint {path} does not fit {type(module).__name__}: {dcp_reason(error)}"
        ) from None


def dcp_reason(error: BaseException) -> str:
    """The line that says what went wrong in a torch distributed checkpoint error (its
    ``CheckpointException`` carries every rank's whole traceback)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    errors = [line for line in lines if line.split(":")[0].endswith(("Error", "Exception"))]
    return errors[-1] if errors else (lines[0] if lines else type(error).__name__)
