"""Loading a checkpoint into a run of any strategy and world size, or its weights into a
plain module (export, evaluation).

DCP's planner reads each rank's part of every tensor from whatever ranks wrote it: a DDP
checkpoint resumes under FSDP and back, an FSDP one on one process. An earlier release's
one-file checkpoint (a ``torch.save`` archive) resumes under DDP or on one process, and
exports and evaluates as before.
"""

from __future__ import annotations

import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.fabric import Fabric
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

# torch types checkpoint_id as PathLike[Unknown]
from torch.distributed.checkpoint.state_dict_loader import (
    load,  # pyright: ignore[reportUnknownVariableType]
)
from torch.distributed.tensor import DTensor

from kiln.core.checkpoints.lookup import META, check_not_a_plain_directory, damage, is_legacy
from kiln.core.checkpoints.registry import by_entry
from kiln.core.checkpoints.rundir import DamagedCheckpointError
from kiln.core.checkpoints.save import one_process_is_the_intent, split_state, unwrapped

_COMPILED_PREFIX = "_orig_mod."
_UNREADABLE = (pickle.UnpicklingError, EOFError, RuntimeError, ValueError, zipfile.BadZipFile)


def _preview(keys: list[str], limit: int = 5) -> str:
    shown = ", ".join(keys[:limit])
    return f"{shown}, ... ({len(keys)} in all)" if len(keys) > limit else shown


def _mismatch(path: Path, name: str, expected: list[str], saved: list[str]) -> str | None:
    """Why the module's keys and the checkpoint's differ, or ``None`` where they do not."""
    missing = [k for k in expected if k not in set(saved)]
    unexpected = [k for k in saved if k not in set(expected)]
    if not missing and not unexpected:
        return None
    lines = [f"checkpoint {path} does not match the model under {name!r}:"]
    if missing:
        lines.append(f"  missing keys: {_preview(missing)}")
    if unexpected:
        lines.append(f"  unexpected keys: {_preview(unexpected)}")
    lines.append("Was it saved by a different model or configuration?")
    return "\n".join(lines)


def dcp_reason(error: BaseException) -> str:
    """The line that says what went wrong in a torch distributed checkpoint error (its
    ``CheckpointException`` carries every rank's whole traceback)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    errors = [line for line in lines if line.split(":")[0].endswith(("Error", "Exception"))]
    return errors[-1] if errors else (lines[0] if lines else type(error).__name__)


def _unreadable(path: Path, error: BaseException) -> DamagedCheckpointError:
    """A damaged-checkpoint error for a load that failed, without torch's advice to load
    with ``weights_only=False`` (a damaged or foreign file is no reason to run its code)."""
    lines = [line.strip() for line in str(error).splitlines()]
    detail = next((line for line in lines if line.startswith("WeightsUnpickler error")), None)
    if detail is None:
        detail = lines[0] if lines and "weights_only" not in lines[0] else type(error).__name__
    return DamagedCheckpointError(
        f"checkpoint {path} is damaged or not a kiln checkpoint: it cannot be read back "
        f"({detail}); resume from an intact checkpoint (resume='auto' skips damaged ones)"
    )


def _read(path: Path, **kwargs: Any) -> dict[str, Any]:
    """``torch.load`` on the CPU, ``weights_only``; a damaged file fails naming its path."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, **kwargs)
    except _UNREADABLE as error:
        raise _unreadable(path, error) from None


def _saved_meta(path: Path) -> dict[str, Any]:
    """A checkpoint's plain values: ``meta.pt`` of a directory; an earlier release's file
    whole (mmap: no tensor is read until used)."""
    return _read(path / META) if path.is_dir() else _read(path, mmap=True)


def read_checkpoint_meta(path: str | Path) -> dict[str, Any]:
    """What a checkpoint says about its run, without Fabric and without loading the model.

    Returns:
        ``config`` (the ``run_config`` given to ``fit``), ``global_step``, ``epoch``,
        ``world_size`` (processes that wrote it), ``threads_per_rank`` (their intra-op
        threads), ``run_id`` (``None`` where absent), and the logged ``history`` and
        ``validation_history`` rows.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        IsADirectoryError: ``path`` is a directory but no checkpoint; the message names
            its newest checkpoint.
        DamagedCheckpointError: It cannot be read back; the message names it.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    check_not_a_plain_directory(path)
    saved = by_entry(_saved_meta(path))
    rng = saved.get("rng")
    loop, world = saved.get("loop", {}), saved.get("world", {})
    return {
        "config": saved.get("config"),
        "global_step": loop.get("global_step"),
        "epoch": loop.get("epoch"),
        "world_size": world.get("world_size", len(rng) if isinstance(rng, list) else None),  # pyright: ignore[reportUnknownArgumentType]
        "threads_per_rank": world.get("threads_per_rank"),
        "run_id": loop.get("run_id"),
        "history": loop.get("history", []),
        "validation_history": loop.get("validation_history", []),
    }


def _saved_keys(path: Path) -> list[str]:
    """The flattened keys a DCP directory holds (``model.<param>``, ``optimizer.state...``)."""
    return list(FileSystemReader(path).read_metadata().state_dict_metadata)


def _load_dcp(path: Path, state: dict[str, Any]) -> dict[str, Any]:
    """Restore ``state``'s objects from a DCP checkpoint directory; the other saved values."""
    module, (module_key,), optimizer_keys = split_state(state)
    model_state = get_model_state_dict(module)
    saved = _saved_keys(path)
    prefix = f"{module_key}."
    problem = _mismatch(
        path,
        module_key,
        list(model_state),
        [k[len(prefix) :] for k in saved if k.startswith(prefix)],
    )
    if problem is not None:
        raise RuntimeError(problem)
    targets: dict[str, Any] = {module_key: model_state}
    for key in optimizer_keys:
        if not any(k.startswith(f"{key}.") for k in saved):
            raise KeyError(f"checkpoint {path} holds no {key!r}; was it saved by another run?")
        targets[key] = get_optimizer_state_dict(module, unwrapped(state[key]))
    try:
        with one_process_is_the_intent():
            load(targets, checkpoint_id=path)
    except (CheckpointException, RuntimeError, ValueError) as error:
        raise RuntimeError(f"could not load checkpoint {path}: {dcp_reason(error)}") from None
    set_model_state_dict(module, targets[module_key])
    for key in optimizer_keys:
        set_optimizer_state_dict(module, unwrapped(state[key]), targets[key])
    return _restore_others(path, _saved_meta(path), state, {module_key, *optimizer_keys})


def _restore_others(
    path: Path, saved: dict[str, Any], state: dict[str, Any], loaded: set[str]
) -> dict[str, Any]:
    """Load the saved state of ``state``'s other objects (scheduler, scaler, callbacks, the
    loop's counters) in place, plain values into ``state``; return what ``state`` did not
    ask for. An object with ``load_missing(path)`` decides what a checkpoint without its
    entry means (it may raise, naming what is missing)."""
    if "loop" in state:  # fit's registry: a checkpoint written before it is read by entry
        saved = by_entry(saved)
    absent = [
        k
        for k, obj in state.items()
        if k not in loaded and k not in saved and not callable(getattr(obj, "load_missing", None))
    ]
    if absent:
        raise KeyError(
            f"checkpoint {path} has no {absent} (it holds {sorted(saved)}); "
            "was it saved by a different kind of run?"
        )
    for key, obj in state.items():
        if key in loaded:
            continue
        if key not in saved:
            obj.load_missing(path)
            continue
        value = saved.pop(key)
        if callable(getattr(obj, "load_state_dict", None)):
            obj.load_state_dict(value)
        else:
            state[key] = value
    return saved


def _load_legacy(path: Path, state: dict[str, Any]) -> dict[str, Any]:
    """Restore ``state``'s objects from an earlier release's one-file checkpoint."""
    module, (module_key,), optimizer_keys = split_state(state)
    if any(isinstance(p, DTensor) for p in module.parameters()):
        raise ValueError(
            f"checkpoint {path} is one file, written by an earlier kiln release under DDP or "
            "on one process: resume it with trainer.strategy=ddp (or auto); its next "
            "checkpoint resumes under any strategy, trainer.strategy=fsdp included"
        )
    saved = _read(path)
    absent = [k for k in (module_key, *optimizer_keys) if k not in saved]
    if absent:
        raise KeyError(
            f"checkpoint {path} has no {absent} (it holds {sorted(saved)}); "
            "was it saved by a different kind of run?"
        )
    weights = {k.replace(_COMPILED_PREFIX, ""): v for k, v in saved.pop(module_key).items()}
    own = {k.replace(_COMPILED_PREFIX, ""): k for k in module.state_dict()}
    problem = _mismatch(path, module_key, list(own), list(weights))
    if problem is not None:
        raise RuntimeError(problem)
    try:
        module.load_state_dict({own[k]: v for k, v in weights.items()}, strict=True)
    except RuntimeError as error:  # e.g. a size mismatch: same names, other shapes
        raise RuntimeError(
            f"checkpoint {path} does not fit the model under {module_key!r}: {error}"
        ) from error
    for key in optimizer_keys:  # the same optimizer, keyed by parameter index
        unwrapped(state[key]).load_state_dict(saved.pop(key))
    return _restore_others(path, saved, state, {module_key, *optimizer_keys})


def load_checkpoint(fabric: Fabric, path: str | Path, state: dict[str, Any]) -> dict[str, Any]:
    """Restore the objects in ``state`` in place from ``path``; return the other saved values.

    Must be called on every rank, of any strategy and world size. Modules load strictly: a
    checkpoint of another model fails naming the checkpoint and the missing and unexpected
    keys. A damaged checkpoint (a file not matching ``checksums.json`` or ``run.json``,
    truncated, unreadable) raises
    :class:`~kiln.core.checkpoints.rundir.DamagedCheckpointError` naming it, before any object
    changes; a directory that is no checkpoint, ``IsADirectoryError`` naming its newest one.

    Args:
        fabric: The run's Fabric (set up the objects in ``state`` first).
        path: The checkpoint.
        state: Objects to restore (model, optimizer, scheduler, ...), as given to
            ``save_checkpoint``.

    Returns:
        The saved values not in ``state``; ``"rng"``, unless ``state`` has it, is this rank's
        RNG state (``None`` when the checkpoint came from another number of ranks).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    check_not_a_plain_directory(path)
    # one rank reads the bytes for the checksum; every rank gets its verdict
    problem = fabric.broadcast(damage(path) if fabric.is_global_zero else None)
    if problem is not None:
        raise DamagedCheckpointError(f"checkpoint {path} is damaged: {problem}")
    remainder = _load_legacy(path, state) if is_legacy(path) else _load_dcp(path, state)
    rng_states = remainder.get("rng")
    if rng_states is not None:  # not asked for (fit registers "rng"): this rank's, or None
        same_world = len(rng_states) == fabric.world_size
        remainder["rng"] = rng_states[fabric.global_rank] if same_world else None
    return remainder


def load_weights(module: torch.nn.Module, path: str | Path, key: str = "model") -> None:
    """Read a checkpoint's model weights into ``module`` (not sharded), in place.

    One process, no process group: DCP reads each saved shard straight into the module's
    own tensors (``state_dict()`` shares them), so memory holds one copy of the model. An
    earlier release's one-file checkpoint is read with ``mmap``. Every weight of the module
    must be in the checkpoint.

    Raises:
        RuntimeError: The checkpoint does not fit the module; the message names both.
    """
    path = Path(path)
    if is_legacy(path):
        weights = _read(path, mmap=True)[key]
        weights = {k.replace(_COMPILED_PREFIX, ""): v for k, v in weights.items()}
        try:
            module.load_state_dict(weights, strict=True)
        except RuntimeError as error:
            raise RuntimeError(
                f"checkpoint {path} does not fit {type(module).__name__}: {error}"
            ) from None
        return
    state = module.state_dict()
    try:
        with warnings.catch_warnings():  # that it loads in one process is the point
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            load({key: state}, checkpoint_id=str(path), no_dist=True)
    except (CheckpointException, RuntimeError, ValueError) as error:
        raise RuntimeError(
            f"checkpoint {path} does not fit {type(module).__name__}: {dcp_reason(error)}"
        ) from None
