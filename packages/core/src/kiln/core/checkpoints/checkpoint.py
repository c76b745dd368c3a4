"""Checkpoints: atomic saves, keep-last-K pruning, resume lookup, and per-rank RNG state.

A checkpoint is ``<dir>/step-<global_step:08d>.ckpt``, written to a temporary name in the same
directory (on its own filesystem, never the system temp dir) and renamed into place only once
it is complete, so a crash mid-write never spoils the newest good checkpoint; a write that
fails (a full disk) removes its partial file and names the checkpoint and the space it
needed. The directory's ``run.json`` (see ``rundir``) then records it with its checksum
(XXH3-128, see ``checksum``): only recorded files are resumed from or pruned, and a file whose
bytes changed is reported as damaged, by path. Module state dicts never carry
``torch.compile``'s ``_orig_mod.`` prefix, so eager and compiled runs share checkpoints.
Everything is stored as tensors and plain Python values, so checkpoints load with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import errno
import logging
import os
import pickle
import random
import shutil
import threading
import warnings
import zipfile
from collections.abc import Callable, Generator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np
import torch
import torch.distributed as dist
from lightning.fabric import Fabric
from lightning.fabric.strategies.ddp import DDPStrategy
from lightning.fabric.strategies.single_device import SingleDeviceStrategy

# lightning re-exports lightning_utilities' function, whose `function` is a bare Callable
from lightning.fabric.utilities.apply_func import (
    apply_to_collection,  # pyright: ignore[reportPrivateImportUsage, reportUnknownVariableType]
)
from lightning.fabric.wrappers import _unwrap_objects  # pyright: ignore[reportPrivateUsage]
from torch._dynamo.eval_frame import OptimizedModule
from torch.distributed.checkpoint.api import CheckpointException
from torch.utils.hooks import RemovableHandle

from kiln.core.atomic import TEMP_SUFFIX, fsync_path, replace_synced
from kiln.core.checkpoints import checksum
from kiln.core.checkpoints.paths import check_not_a_plain_directory
from kiln.core.checkpoints.rundir import (
    CHECKPOINT_NAME,
    CheckpointWriteError,
    DamagedCheckpointError,
    RunFile,
    new_run_id,
    read_run_file,
    recorded_run,
    write_run_file,
)
from kiln.core.checkpoints.sharded import (
    checksum_damage,
    dcp_reason,
    restore_stateful,
    write_checksums,
)

log = logging.getLogger(__name__)

_COMPILED_PREFIX = "_orig_mod."
# fabric.load restores these strategies' module state from one plain state dict, which lets
# us check keys and strip prefixes first; sharded strategies (FSDP, ...) go through fabric.load.
_PLAIN_STATE_STRATEGIES = (SingleDeviceStrategy, DDPStrategy)


# -- RNG state ----------------------------------------------------------------------------

# numpy's legacy state of its global MT19937 generator (never the dict form there)
_NumpyState = tuple[str, np.ndarray[Any, np.dtype[np.uint32]], int, int, float]


def capture_rng_state() -> dict[str, Any]:
    """This process's RNG states: python ``random``, numpy, torch CPU and every CUDA device.

    The numpy state is stored as a tensor and plain values so the checkpoint stays loadable
    with ``weights_only=True``.
    """
    name, keys, pos, has_gauss, cached_gaussian = cast(
        _NumpyState, np.random.get_state(legacy=True)
    )
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "name": name,
            "keys": torch.as_tensor(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore the RNG states captured by :func:`capture_rng_state`.

    CUDA states are restored for the devices both the checkpoint and this machine have.
    """
    for key in ("python", "numpy", "torch"):
        if key not in state:
            raise ValueError(
                f"RNG state is missing {key!r} (has {sorted(state)}); "
                "expected the dict returned by capture_rng_state()"
            )
    version, internal, gauss_next = state["python"]
    # weights_only loading may turn the inner tuple into a list; random.setstate wants a tuple
    random.setstate((version, tuple(internal), gauss_next))
    np_state = state["numpy"]
    np.random.set_state(
        (
            np_state["name"],
            np_state["keys"].numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        for device, cuda_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, device)


def _gather_rng_states() -> list[dict[str, Any]]:
    """Every rank's RNG state, indexed by global rank (a single entry without a process group)."""
    local = capture_rng_state()
    if not (dist.is_available() and dist.is_initialized()):
        return [local]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    return gathered


# -- names and lookup ---------------------------------------------------------------------


def checkpoint_path(directory: str | Path, step: int) -> Path:
    """Path of the checkpoint for optimizer step ``step``: ``directory/step-{step:08d}.ckpt``."""
    if step < 0:
        raise ValueError(f"step={step} is not valid; a checkpoint step must be >= 0")
    return Path(directory) / f"step-{step:08d}.ckpt"


def _is_complete(path: Path) -> bool:
    """Whether ``path`` looks like a whole checkpoint (cheap: no tensor is read)."""
    if path.is_dir():
        # torch.distributed.checkpoint writes its metadata file last
        return (path / ".metadata").is_file()
    # torch.save writes a zip archive whose central directory comes last: a truncated
    # file has none
    try:
        return zipfile.is_zipfile(path)
    except OSError:
        return False


def checkpoint_candidates(directory: str | Path) -> list[Path]:
    """The checkpoints a resume may use, newest first: those ``run.json`` records (in the
    order written); where ``run.json`` is lost, those that prove themselves
    (``rundir.rebuild_run_file``; it raises ``CheckpointDirError`` where none does)."""
    directory = Path(directory)
    recorded = recorded_run(directory) if directory.is_dir() else None
    return [] if recorded is None else [directory / name for name in reversed(recorded.checkpoints)]


def damage(path: str | Path) -> str | None:
    """Why ``path`` cannot be a good checkpoint (missing, incomplete, checksum mismatch), or
    ``None``. Reads the whole file once when ``run.json`` records its checksum."""
    path = Path(path)
    if not path.exists():
        return "the file is missing"
    if not _is_complete(path):
        return "the file is incomplete or unreadable (truncated?)"
    if path.is_dir():  # sharded: each file against the directory's own checksums.json
        problem = checksum_damage(path)
        if problem is not None:
            return problem
    recorded = read_run_file(path.parent)
    expected = None
    if recorded is not None:
        expected = recorded.checkpoints.get(path.name, recorded.named.get(path.name))
    if expected is not None and not checksum.matches(path, expected):
        return f"its checksum does not match the one {path.parent / 'run.json'} recorded"
    if expected is None and path.is_file():  # no run.json to compare with: its own CRC-32s
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
        if bad is not None:
            return f"its record {bad} fails its CRC-32 check"
    return None


def find_latest_checkpoint(directory: str | Path) -> Path | None:
    """The newest intact checkpoint in ``directory`` (see :func:`checkpoint_candidates`).

    Temporary files of interrupted saves are never considered; damaged files (truncated,
    unreadable, or not matching their recorded checksum) are skipped with a warning that
    names them.
    """
    for path in checkpoint_candidates(directory):
        problem = damage(path)
        if problem is None:
            return path
        warnings.warn(f"skipping damaged checkpoint {path}: {problem}", stacklevel=2)
    return None


# -- saving -------------------------------------------------------------------------------


def _strip_compiled_prefix(key: str) -> str:
    return key.replace(_COMPILED_PREFIX, "")


def _strip_compiled_keys(
    module: torch.nn.Module, state_dict: dict[str, Any], prefix: str, *_: Any
) -> None:
    """State-dict post hook: drop ``_orig_mod.`` from the keys, in place, keeping their order."""
    items = list(state_dict.items())
    state_dict.clear()
    for key, value in items:
        if key.startswith(prefix):
            key = prefix + _strip_compiled_prefix(key[len(prefix) :])
        state_dict[key] = value


@contextmanager
def _without_compiled_prefixes(state: dict[str, Any]) -> Generator[None, None, None]:
    """While active, state dicts of the modules in ``state`` have no ``_orig_mod.`` keys.

    Fabric already unwraps a compiled module it set up; this covers a bare compiled module
    and compiled submodules (``model.encoder = torch.compile(encoder)``).
    """
    handles: list[RemovableHandle] = []
    for obj in _unwrap_objects(state).values():
        if isinstance(obj, torch.nn.Module) and any(
            isinstance(m, OptimizedModule) for m in obj.modules()
        ):
            # torch leaves the hook parameter unannotated
            handles.append(
                obj.register_state_dict_post_hook(_strip_compiled_keys)  # pyright: ignore[reportUnknownMemberType]
            )
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _record_and_prune(
    directory: Path,
    final: Path,
    keep_last_k: int,
    run_id: str | None,
    named: bool,
    digest: str | None = None,
) -> None:
    """Record ``final`` with its checksum in ``run.json`` (``digest``, the checksum of the
    bytes written, or read back from the file); keep this run's newest K files."""
    digest = digest or checksum.checksum_of(final)
    recorded = read_run_file(directory) or RunFile(run_id or new_run_id())
    if run_id is not None and recorded.run_id != run_id:
        raise RuntimeError(
            f"{directory / 'run.json'} names run {recorded.run_id}, not {run_id}: "
            "a checkpoint directory belongs to one run"
        )
    if named:  # best.ckpt and the like: checksummed, but neither pruned nor resumed from
        recorded.named[final.name] = digest
        write_run_file(directory, recorded)
        return
    recorded.checkpoints.pop(final.name, None)  # re-saved: now the newest
    recorded.checkpoints[final.name] = digest
    names = list(recorded.checkpoints)
    stale = names[:-keep_last_k]
    recorded.checkpoints = {name: recorded.checkpoints[name] for name in names[-keep_last_k:]}
    write_run_file(directory, recorded)  # first forget, then delete: never list a lost file
    for name in stale:
        _remove(directory / name)
    # save_checkpoint is collective and has just renamed its own temp file, so any temp
    # file left here belongs to an earlier, interrupted save
    for path in directory.glob(f"step-*.ckpt{TEMP_SUFFIX}"):
        _remove(path)


def save_checkpoint(
    fabric: Fabric,
    directory: str | Path,
    step: int,
    state: dict[str, Any],
    keep_last_k: int,
    name: str | None = None,
    run_id: str | None = None,
    commits: CheckpointCommits | None = None,
) -> Path:
    """Save ``state`` atomically as the checkpoint of ``step``; keep the newest ``keep_last_k``.

    Once renamed into place, the file is recorded with its checksum in the directory's
    ``run.json``; pruning removes only files recorded there.

    With ``commits``, the state is serialized here (what it holds is fixed when this
    returns), and rank 0 writes, fsyncs, renames and records the file in a thread while the
    caller goes on (one-file checkpoints; a sharded one is written here all the same): the
    file is in place once ``commits.wait`` returns, and until then the directory's newest
    checkpoint is the previous one.

    Must be called on every rank. ``state`` maps names to Fabric-saveable objects (the
    Fabric-wrapped model, optimizer, scheduler, grad scaler...) and plain values (global
    step, epoch, batch position, run config). Every rank's :func:`capture_rng_state` is
    stored under ``"rng"`` as a list indexed by global rank.

    Args:
        fabric: The run's Fabric.
        directory: Checkpoint directory (created if missing).
        step: The optimizer step the checkpoint holds (names the file).
        state: What to save; ``"rng"`` is reserved.
        keep_last_k: How many of the newest checkpoints to keep (>= 1).
        name: A file name to save under instead of ``step-<step>.ckpt`` (e.g.
            ``best.ckpt``); such a file is never pruned nor found by ``resume="auto"``.
        run_id: The run the directory belongs to (``run.json`` is created with it, or must
            name it); ``None`` uses the directory's run, or a new one.
        commits: Where rank 0's write finishes in the background (see above); ``None``:
            the file is written and recorded before this returns.

    Returns:
        The checkpoint's final path.

    Raises:
        CheckpointWriteError: The file could not be written (a full disk); also raised here
            for an earlier save of ``commits`` that failed.
    """
    if keep_last_k < 1:
        raise ValueError(f"keep_last_k={keep_last_k} is not valid; keep at least 1 checkpoint")
    if "rng" in state:
        raise ValueError("state key 'rng' is reserved: it holds each rank's RNG state")
    if commits is not None:  # one save at a time: the last one is in place, or failed here
        commits.wait(fabric)
    directory = Path(directory)
    final = checkpoint_path(directory, step) if name is None else _named(directory, name)
    temp = final.with_name(final.name + TEMP_SUFFIX)
    if fabric.is_global_zero:
        directory.mkdir(parents=True, exist_ok=True)
        if temp.exists():
            _remove(temp)
    fabric.barrier()

    to_save = {**state, "rng": _gather_rng_states()}
    record = partial(_commit, directory, temp, final, keep_last_k, run_id, name is not None)
    one_file = isinstance(fabric.strategy, _PLAIN_STATE_STRATEGIES)
    with _without_compiled_prefixes(to_save):
        if not one_file:  # sharded: every rank writes its part now
            problem = _write_sharded(fabric, temp, final, to_save)
            record = partial(record, None)  # a directory's digest: taken of its files on disk
        elif fabric.is_global_zero:
            problem, record = _write_one_file(fabric, temp, final, to_save, record, commits)
        else:
            problem = None
    problem = fabric.broadcast(problem)  # all ranks, or none
    if problem is not None:
        raise CheckpointWriteError(problem)
    if fabric.is_global_zero and record is not None:
        record()
    fabric.barrier()
    return final


def _write_one_file(
    fabric: Fabric,
    temp: Path,
    final: Path,
    state: dict[str, Any],
    record: Callable[[str], None],
    commits: CheckpointCommits | None,
) -> tuple[str | None, Callable[[], None] | None]:
    """Rank 0's one-file checkpoint: ``torch.save`` into ``temp`` (what ``fabric.save`` does
    for these strategies, but staged in the checkpoint's own directory: Lightning's writer
    stages in the system temp dir and copies across), then its fsync, rename and record:
    here, or handed to ``commits`` to finish in a thread (the bytes are on their way to disk
    once ``torch.save`` returns, so training may move the weights on).

    Returns:
        Why it failed (or ``None``), and what is left to do here (``None``: nothing, the
        thread does it or the write failed).
    """
    convert = fabric.strategy._convert_stateful_objects_in_state  # pyright: ignore[reportPrivateUsage]
    converted = convert(_unwrap_objects(state), {})
    size = _tensor_bytes(converted)
    try:
        if shutil.disk_usage(final.parent).free < size:  # fail before writing a byte
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        digest = _save_file(temp, converted)
        if commits is None:
            fsync_path(temp)
    except OSError as error:
        _remove(temp)
        return _write_failure(final, size, error), None
    if commits is None:
        return None, partial(record, digest)

    def commit() -> None:
        try:
            fsync_path(temp)
        except OSError as error:
            _remove(temp)
            raise CheckpointWriteError(_write_failure(final, size, error)) from error
        record(digest)

    commits.submit(final, commit)
    return None, None


class _HashingWriter:
    """A file's ``write`` that also feeds the checksum of everything written: the checksum of
    the very bytes torch writes, without reading the file back (XXH3 hashes faster than the
    bytes are written)."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle, self.hasher = handle, checksum.new_hasher()

    def write(self, data: bytes | memoryview) -> int:
        self.hasher.update(data)
        return self.handle.write(data)

    def flush(self) -> None:
        self.handle.flush()


def _save_file(temp: Path, state: dict[str, Any]) -> str:
    """``torch.save`` ``state`` into ``temp`` (flushed, not yet synced); its checksum."""
    with open(temp, "wb") as handle:
        writer = _HashingWriter(handle)
        torch.save(state, writer)  # pyright: ignore[reportArgumentType]  (a file-like writer)
        writer.flush()
    return checksum.recorded(writer.hasher)


def _tensor_bytes(state: Any) -> int:
    """The tensor bytes in ``state``: about what its ``torch.save`` file needs on disk."""
    sizes: list[int] = []

    def add(tensor: torch.Tensor) -> None:
        sizes.append(tensor.nbytes)

    apply_to_collection(state, torch.Tensor, add)
    return sum(sizes)


def _write_sharded(fabric: Fabric, temp: Path, final: Path, state: dict[str, Any]) -> str | None:
    """Every rank writes its part into the directory ``temp`` (flushed to disk); on a failure,
    what was written is removed. Returns why it failed (rank 0's answer counts) or ``None``."""
    try:
        fabric.save(temp, state)
        if fabric.is_global_zero:  # every rank's shard is written once save returns here
            write_checksums(temp)
            fsync_path(temp)
    except OSError as error:
        if fabric.is_global_zero:
            _remove(temp)
        return _write_failure(final, None, error)
    return None


def _commit(
    directory: Path,
    temp: Path,
    final: Path,
    keep_last_k: int,
    run_id: str | None,
    named: bool,
    digest: str | None,
) -> None:
    """Rename the complete, fsynced ``temp`` into place and record it (rank 0)."""
    if final.is_dir():  # os.replace cannot replace a non-empty directory
        shutil.rmtree(final)
    replace_synced(temp, final)
    _record_and_prune(directory, final, keep_last_k, run_id, named, digest)


class CheckpointCommits:
    """Rank 0's one-file checkpoints being written, fsynced, renamed into place and recorded
    in ``run.json`` in a thread while training goes on: one at a time, in order.

    The loop saves its periodic checkpoints with one (:func:`save_checkpoint`'s ``commits``),
    which waits for the previous save first, and calls :meth:`wait` at the end of the fit,
    before anything reads the directory; on an error, :meth:`close`. A crash before a
    commit ends leaves its temporary file (removed at the next start) and the previous
    checkpoint as the newest, as a crash during a save always did.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._path: Path | None = None
        self._error: BaseException | None = None

    def submit(self, path: Path, commit: Callable[[], None]) -> None:
        """Run ``commit`` (which writes ``path``) in a thread; nothing may be pending."""
        if self._thread is not None:
            raise RuntimeError(f"checkpoint {self._path} is still being written; wait() first")

        def run() -> None:
            try:
                commit()
            except BaseException as error:  # raised in the caller's thread by wait()
                self._error = error

        self._path, self._error = path, None
        self._thread = threading.Thread(target=run, name=f"kiln-commit-{path.name}")
        self._thread.start()

    def _join(self) -> tuple[Path | None, BaseException | None]:
        if self._thread is None:
            return None, None
        self._thread.join()
        path, error = self._path, self._error
        self._thread, self._path, self._error = None, None, None
        return path, error

    def wait(self, fabric: Fabric) -> None:
        """Wait until the pending checkpoint is in place; every rank calls it (a failure on
        rank 0 is raised on all of them).

        Raises:
            CheckpointWriteError: Rank 0 could not write it (the earlier ones are intact).
        """
        _, error = self._join()
        problem = None if error is None else str(error)
        if fabric.world_size > 1:
            problem = fabric.broadcast(problem)
        if error is not None and not isinstance(error, CheckpointWriteError):
            raise error
        if problem is not None:
            raise CheckpointWriteError(problem)

    def close(self) -> bool:
        """Wait for the pending checkpoint on this process alone (an error path: no
        collective), logging a failure instead of raising it over the error at hand.

        Returns:
            Whether a checkpoint was pending and is now in place.
        """
        path, error = self._join()
        if error is not None:
            log.error("checkpoint %s was not written: %s", path, error)
        return path is not None and error is None


def _write_failure(final: Path, size: int | None, error: OSError) -> str:
    needed = "" if size is None else f" it needs {size / 2**20:.1f} MiB,"
    try:
        free = f" {shutil.disk_usage(final.parent).free / 2**20:.1f} MiB are free there;"
    except OSError:
        free = ""
    return (
        f"could not write checkpoint {final} ({error.strerror or error}):{needed}{free} no "
        "partial file is left and the earlier checkpoints are intact. Free some space or "
        "set trainer.checkpoint_dir to a larger disk, then resume"
    )


def _named(directory: Path, name: str) -> Path:
    if Path(name).name != name or CHECKPOINT_NAME.match(name) or name.endswith(TEMP_SUFFIX):
        raise ValueError(
            f"name={name!r} is not valid: give a plain file name that is not named like the "
            "loop's own step-<N>.ckpt checkpoints (e.g. 'best.ckpt')"
        )
    return directory / name


# -- loading ------------------------------------------------------------------------------


def _preview(keys: list[str], limit: int = 5) -> str:
    shown = ", ".join(keys[:limit])
    return f"{shown}, ... ({len(keys)} in all)" if len(keys) > limit else shown


def _load_module(
    fabric: Fabric, path: Path, name: str, module: torch.nn.Module, saved: dict[str, Any]
) -> None:
    """Load ``saved`` into ``module`` with keys matched up to ``_orig_mod.`` prefixes."""
    # the module's own keys (a compiled submodule keeps its prefix), by prefix-free name
    actual = {_strip_compiled_prefix(k): k for k in fabric.strategy.get_module_state_dict(module)}
    saved = {_strip_compiled_prefix(k): v for k, v in saved.items()}
    missing = [k for k in actual if k not in saved]
    unexpected = [k for k in saved if k not in actual]
    if missing or unexpected:
        lines = [f"checkpoint {path} does not match the model under {name!r}:"]
        if missing:
            lines.append(f"  missing keys: {_preview(missing)}")
        if unexpected:
            lines.append(f"  unexpected keys: {_preview(unexpected)}")
        lines.append("Was it saved by a different model or configuration?")
        raise RuntimeError("\n".join(lines))
    try:
        fabric.strategy.load_module_state_dict(
            module, {actual[k]: v for k, v in saved.items()}, strict=True
        )
    except RuntimeError as error:  # e.g. a size mismatch: same names, other shapes
        raise RuntimeError(
            f"checkpoint {path} does not fit the model under {name!r}: {error}"
        ) from error


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


_UNREADABLE = (pickle.UnpicklingError, EOFError, RuntimeError, ValueError, zipfile.BadZipFile)


def _read(path: Path, **kwargs: Any) -> dict[str, Any]:
    """``torch.load`` of a checkpoint file on the CPU; a damaged file fails naming its path."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, **kwargs)
    except _UNREADABLE as error:
        raise _unreadable(path, error) from None


def read_checkpoint_meta(path: str | Path) -> dict[str, Any]:
    """What a checkpoint says about its run, without Fabric and without loading the model.

    Args:
        path: A checkpoint written by ``fit`` (a file, or a sharded checkpoint directory).

    Returns:
        ``config`` (the ``run_config`` given to ``fit``), ``global_step``, ``epoch``,
        ``world_size`` (processes that wrote it), ``threads_per_rank`` (their intra-op
        threads) and ``run_id`` (``None`` where absent).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        IsADirectoryError: ``path`` is a directory but no sharded checkpoint; the message
            names its newest checkpoint.
        DamagedCheckpointError: It cannot be read back; the message names it.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    check_not_a_plain_directory(path)
    # a sharded checkpoint keeps its plain values in meta.pt; mmap reads no tensor eagerly
    saved = _read(path / "meta.pt") if path.is_dir() else _read(path, mmap=True)
    rng = saved.get("rng")
    return {
        "config": saved.get("config"),
        "global_step": saved.get("global_step"),
        "epoch": saved.get("epoch"),
        "world_size": saved.get("world_size", len(rng) if isinstance(rng, list) else None),  # pyright: ignore[reportUnknownArgumentType]
        "threads_per_rank": saved.get("threads_per_rank"),
        "run_id": saved.get("run_id"),
    }


def _load_plain(fabric: Fabric, path: Path, state: dict[str, Any]) -> dict[str, Any]:
    """What ``fabric.load(path, state)`` does, with key checks and prefix handling for modules."""
    checkpoint = _read(path)
    absent = [k for k in state if k not in checkpoint]
    if absent:
        raise KeyError(
            f"checkpoint {path} has no {absent} (it holds {sorted(checkpoint)}); "
            "was it saved by a different kind of run?"
        )
    for name, obj in _unwrap_objects(state).items():
        saved = checkpoint.pop(name)
        if isinstance(obj, torch.nn.Module):
            _load_module(fabric, path, name, obj, saved)
        elif hasattr(obj, "load_state_dict"):  # optimizer, scheduler, grad scaler, ...
            obj.load_state_dict(saved)
        else:
            state[name] = saved
    return checkpoint


def load_checkpoint(fabric: Fabric, path: str | Path, state: dict[str, Any]) -> dict[str, Any]:
    """Restore the objects in ``state`` in place from ``path``; return the other saved values.

    Must be called on every rank. Modules load strictly; a checkpoint of another model fails
    with an error that names the checkpoint and lists missing and unexpected keys. A damaged
    file (checksum mismatch with ``run.json``, truncated, unpicklable) raises
    :class:`~kiln.core.checkpoints.rundir.DamagedCheckpointError` naming it, before any object
    changes; a directory that is no sharded checkpoint, ``IsADirectoryError`` naming its newest one.
    Checkpoints whose keys carry ``_orig_mod.`` (written by other tools) load too.

    Args:
        fabric: The run's Fabric (set up the objects in ``state`` first).
        path: The checkpoint.
        state: Objects to restore (model, optimizer, scheduler, ...), as given to
            :func:`save_checkpoint`.

    Returns:
        The saved values not in ``state`` (global step, epoch, ...), with ``"rng"`` replaced
        by this rank's RNG state, for the loop to pass to :func:`restore_rng_state` when it
        is time; ``None`` when the checkpoint came from another number of ranks (each
        rank's stream belongs to the world that saved it).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    check_not_a_plain_directory(path)
    # one rank reads the bytes for the checksum; every rank gets its verdict
    problem = fabric.broadcast(damage(path) if fabric.is_global_zero else None)
    if problem is not None:
        raise DamagedCheckpointError(f"checkpoint {path} is damaged: {problem}")
    if isinstance(fabric.strategy, _PLAIN_STATE_STRATEGIES) and path.is_file():
        remainder = _load_plain(fabric, path, state)
    else:
        loaded: dict[str, Any] = dict(state)
        try:
            remainder = fabric.load(path, loaded)
            restore_stateful(state, loaded)
        except (pickle.UnpicklingError, EOFError) as error:
            raise _unreadable(path, error) from None
        except (KeyError, RuntimeError, CheckpointException) as error:
            raise RuntimeError(f"could not load checkpoint {path}: {dcp_reason(error)}") from None

    rng_states = remainder.get("rng")
    if rng_states is not None:
        # the streams belong to the ranks of the world that saved them
        same_world = len(rng_states) == fabric.world_size
        remainder["rng"] = rng_states[fabric.global_rank] if same_world else None
    return remainder
