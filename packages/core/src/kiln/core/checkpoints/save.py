"""Saving a checkpoint: one format for every strategy, staged, renamed into place, recorded.

A checkpoint is the directory ``<dir>/step-<global_step:08d>.ckpt`` that torch distributed
checkpoint (DCP) writes: the model's and the optimizer's state, each rank writing what it
holds (its shards under FSDP; under DDP or one process the replicated tensors are written
once), keyed by parameter name, so DCP's planner reshards them on load for any strategy and
world size. Beside them, ``meta.pt`` (rank 0) holds every other registered piece's
``state_dict()`` (the loop's counters, every rank's RNG state, scheduler, grad scaler,
callbacks; ``kiln.core.checkpoints.registry``), and
``checksums.json`` the checksum of every other file, written last. The directory is written
under a temporary name in the checkpoint directory and renamed into place only when complete
and flushed to disk; ``run.json`` (see ``rundir``) then records it with its checksum. A crash
mid-write leaves the previous checkpoint the newest; a full disk names the space it needed.
Module state never carries ``torch.compile``'s ``_orig_mod.`` prefix.

An asynchronous save (:class:`CheckpointWrites`) copies the state and returns; the files are
written, checksummed, renamed and recorded while training goes on, one save at a time.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
import warnings
from collections.abc import Callable, Generator
from concurrent.futures import Future
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from lightning.fabric import Fabric
from lightning.fabric.wrappers import is_wrapped
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

# torch types checkpoint_id as PathLike[Unknown]
from torch.distributed.checkpoint.state_dict_saver import (
    async_save,  # pyright: ignore[reportUnknownVariableType]
    save,  # pyright: ignore[reportUnknownVariableType]
)
from torch.distributed.tensor import DTensor

from kiln.core.atomic import TEMP_SUFFIX, fsync_path, replace_synced
from kiln.core.checkpoints import checksum, rundir
from kiln.core.checkpoints.lookup import META, checkpoint_path
from kiln.core.checkpoints.rng import gather_rng_states

log = logging.getLogger(__name__)


def unwrapped(obj: Any) -> Any:
    """The module or optimizer inside Fabric's wrapper (``obj`` itself if it is not wrapped)."""
    if not is_wrapped(obj):
        return obj
    return obj.module if isinstance(obj, torch.nn.Module) else obj.optimizer


def split_state(state: dict[str, Any]) -> tuple[torch.nn.Module, list[str], list[str]]:
    """The one module of ``state`` (unwrapped), and the keys of its module and optimizers.

    Raises:
        ValueError: ``state`` holds no module, or more than one.
    """
    modules = [k for k, v in state.items() if isinstance(unwrapped(v), torch.nn.Module)]
    if len(modules) != 1:
        raise ValueError(
            f"a checkpoint holds exactly one module (found {len(modules)}: {modules}); "
            "pass it as state={'model': model, 'optimizer': optimizer, ...}"
        )
    optimizers = [k for k, v in state.items() if isinstance(unwrapped(v), torch.optim.Optimizer)]
    return unwrapped(state[modules[0]]), modules, optimizers


def _tensor_state(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``state`` as DCP's part (the module's and optimizers' state, by parameter name) and
    ``meta.pt``'s part (plain values; other objects' ``state_dict()``)."""
    module, module_keys, optimizer_keys = split_state(state)
    tensors: dict[str, Any] = {module_keys[0]: get_model_state_dict(module)}
    for key in optimizer_keys:
        tensors[key] = get_optimizer_state_dict(module, unwrapped(state[key]))
    meta = {
        key: value.state_dict() if callable(getattr(value, "state_dict", None)) else value
        for key, value in state.items()
        if key not in tensors
    }
    return tensors, meta


def _local_bytes(tensors: Any) -> int:
    """The bytes of the tensors this rank holds in ``tensors`` (a DTensor: its local shard)."""
    if isinstance(tensors, DTensor):
        return tensors.to_local().nbytes
    if isinstance(tensors, torch.Tensor):
        return tensors.nbytes
    if isinstance(tensors, dict):
        return sum(_local_bytes(v) for v in tensors.values())  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    if isinstance(tensors, list | tuple):
        return sum(_local_bytes(v) for v in tensors)  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    return 0


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _any_problem(fabric: Fabric, problem: str | None) -> str | None:
    """The first rank's problem (in rank order), on every rank; ``None`` where none had one."""
    if fabric.world_size == 1:
        return problem
    problems: list[str | None] = [None] * fabric.world_size
    dist.all_gather_object(problems, problem)
    return next((p for p in problems if p is not None), None)


def _write_failure(final: Path, size: int | None, error: BaseException) -> str:
    needed = "" if size is None else f" this rank needs {size / 2**20:.1f} MiB,"
    try:
        free = f" {shutil.disk_usage(final.parent).free / 2**20:.1f} MiB are free there;"
    except OSError:
        free = ""
    reason = error.strerror if isinstance(error, OSError) and error.strerror else error
    return (
        f"could not write checkpoint {final} ({reason}):{needed}{free} no partial checkpoint "
        "is left and the earlier checkpoints are intact. Free some space or set "
        "trainer.checkpoint_dir to a larger disk, then resume"
    )


def _record_and_prune(
    directory: Path, final: Path, keep_last_k: int, run_id: str | None, named: bool
) -> None:
    """Record ``final`` with its checksum in ``run.json``; keep this run's newest K."""
    digest = checksum.checksum_of(final)
    recorded = rundir.read_run_file(directory) or rundir.RunFile(run_id or rundir.new_run_id())
    if run_id is not None and recorded.run_id != run_id:
        raise RuntimeError(
            f"{directory / 'run.json'} names run {recorded.run_id}, not {run_id}: "
            "a checkpoint directory belongs to one run"
        )
    if named:  # best.ckpt and the like: checksummed, but neither pruned nor resumed from
        recorded.named[final.name] = digest
        rundir.write_run_file(directory, recorded)
        return
    recorded.checkpoints.pop(final.name, None)  # re-saved: now the newest
    recorded.checkpoints[final.name] = digest
    names = list(recorded.checkpoints)
    stale = names[:-keep_last_k]
    recorded.checkpoints = {name: recorded.checkpoints[name] for name in names[-keep_last_k:]}
    rundir.write_run_file(directory, recorded)  # first forget, then delete: never list a lost file
    for name in stale:
        _remove(directory / name)
    # saves are collective and one at a time, so a temp name left here belongs to an earlier,
    # interrupted save
    for path in directory.glob(f"step-*.ckpt{TEMP_SUFFIX}"):
        _remove(path)


def _commit(
    temp: Path, final: Path, record: Callable[[], None], written: Future[Any] | None
) -> None:
    """Rank 0, once every rank's files are in ``temp``: checksums, flush, rename, record."""
    if written is not None:
        written.result()  # raises what the write raised
    checksum.write_checksums(temp)
    fsync_path(temp)
    if final.is_dir():  # os.replace cannot replace a non-empty directory
        shutil.rmtree(final)
    elif final.exists():
        final.unlink()
    replace_synced(temp, final)
    record()


def save_checkpoint(
    fabric: Fabric,
    directory: str | Path,
    step: int,
    state: dict[str, Any],
    keep_last_k: int,
    name: str | None = None,
    run_id: str | None = None,
    writes: CheckpointWrites | None = None,
) -> Path:
    """Save ``state`` as the checkpoint of ``step``; keep the newest ``keep_last_k``.

    Must be called on every rank. ``state`` maps names to the Fabric-wrapped (or plain)
    model and optimizer, other objects with ``state_dict()`` (scheduler, grad scaler,
    callbacks, the loop's counters; ``kiln.core.checkpoints.registry``) and plain values.
    Unless ``state`` has ``"rng"``, every rank's RNG state is stored there, a list by rank.

    Args:
        fabric: The run's Fabric.
        directory: Checkpoint directory (created if missing).
        step: The optimizer step the checkpoint holds (names it).
        state: What to save, by key.
        keep_last_k: How many of the newest checkpoints to keep (>= 1).
        name: A name to save under instead of ``step-<step>.ckpt`` (e.g. ``best.ckpt``);
            such a checkpoint is never pruned nor found by ``resume="auto"``.
        run_id: The run the directory belongs to (``run.json`` is created with it, or must
            name it); ``None`` uses the directory's run, or a new one.
        writes: Write asynchronously through it (see :class:`CheckpointWrites`): the state
            is copied before this returns and the checkpoint is in place once
            ``writes.wait`` returns; ``None``: in place when this returns.

    Returns:
        The checkpoint's final path.

    Raises:
        rundir.CheckpointWriteError: It could not be written (a full disk); also raised here for
            an earlier asynchronous save that failed.
    """
    if keep_last_k < 1:
        raise ValueError(f"keep_last_k={keep_last_k} is not valid; keep at least 1 checkpoint")
    if writes is not None:  # one save at a time: the last one is in place, or failed here
        writes.wait(fabric)
    directory = Path(directory)
    final = checkpoint_path(directory, step) if name is None else _named(directory, name)
    temp = final.with_name(final.name + TEMP_SUFFIX)
    if fabric.is_global_zero:
        directory.mkdir(parents=True, exist_ok=True)
        _remove(temp)
        temp.mkdir()
    fabric.barrier()

    tensors, meta = _tensor_state(state)  # on every rank: a state_dict() may be a collective
    if "rng" not in state:  # fit registers its own ("rng": checkpoints.rng.RngStreams)
        meta["rng"] = gather_rng_states()
    size = _local_bytes(tensors)
    _write(fabric, temp, final, size, meta, None if writes is not None else tensors)

    record = partial(_record_and_prune, directory, final, keep_last_k, run_id, name is not None)
    if writes is not None:
        writes.start(fabric, final, temp, tensors, record, size)
    elif fabric.is_global_zero:
        _commit(temp, final, record, None)
    if writes is None:
        fabric.barrier()
    return final


def _write(
    fabric: Fabric,
    temp: Path,
    final: Path,
    size: int,
    meta: dict[str, Any],
    tensors: dict[str, Any] | None,
) -> None:
    """Write ``meta.pt`` (rank 0) and, where given, ``tensors`` (every rank) into ``temp``;
    on any rank's failure remove ``temp`` and raise on every rank."""
    problem = None
    try:  # fail before writing a byte where this rank's part cannot fit
        if shutil.disk_usage(final.parent).free < size:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if fabric.is_global_zero:
            torch.save(meta, temp / META)
    except OSError as error:
        problem = _write_failure(final, size, error)
    problem = _any_problem(fabric, problem)
    if problem is None and tensors is not None:
        try:
            with one_process_is_the_intent():
                save(tensors, checkpoint_id=temp)
        except Exception as error:  # DCP wraps each rank's OSError in a CheckpointException
            problem = _write_failure(final, size, error)
        problem = _any_problem(fabric, problem)
    if problem is not None:
        if fabric.is_global_zero:
            _remove(temp)
        raise rundir.CheckpointWriteError(problem)


@contextmanager
def one_process_is_the_intent() -> Generator[None]:
    """DCP without a process group warns that it assumes one process: in kiln that is the
    run's world, not a guess (a multi-process run always has its group)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _named(directory: Path, name: str) -> Path:
    if Path(name).name != name or rundir.CHECKPOINT_NAME.match(name) or name.endswith(TEMP_SUFFIX):
        raise ValueError(
            f"name={name!r} is not valid: give a plain file name that is not named like the "
            "loop's own step-<N>.ckpt checkpoints (e.g. 'best.ckpt')"
        )
    return directory / name


class CheckpointWrites:
    """Checkpoints written while training goes on: one at a time, in order.

    :func:`save_checkpoint` with ``writes=`` copies the state (DCP's ``async_save`` stages it
    in host memory) and returns; a thread per rank waits for its files, and rank 0's then
    writes ``checksums.json``, flushes, renames the directory into place and records it in
    ``run.json``. The loop calls :meth:`wait` before the next save and at the end of the fit
    (a stop on a signal included), before anything reads the directory; on an error,
    :meth:`close`. Until a write ends, the directory's newest checkpoint is the previous one;
    a crash meanwhile leaves only the temporary directory (removed at the next start).
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._path: Path | None = None
        self._error: BaseException | None = None
        self._group: Any = None  # a gloo group of its own: the thread's collectives

    def start(
        self,
        fabric: Fabric,
        final: Path,
        temp: Path,
        tensors: dict[str, Any],
        record: Callable[[], None],
        size: int,
    ) -> None:
        """Copy ``tensors`` and write them into ``temp`` in the background (every rank)."""
        if self._thread is not None:
            raise RuntimeError(f"checkpoint {self._path} is still being written; wait() first")
        if fabric.world_size > 1 and self._group is None:
            self._group = dist.new_group(backend="gloo")
        # with the default stager async_save answers a Future (AsyncSaveResponse: a custom one)
        with one_process_is_the_intent():
            written = cast(
                "Future[Any]", async_save(tensors, checkpoint_id=temp, process_group=self._group)
            )
        rank_zero = fabric.is_global_zero

        def run() -> None:
            try:
                if rank_zero:
                    _commit(temp, final, record, written)
                else:
                    written.result()
            except BaseException as error:  # raised in the caller's thread by wait()
                if rank_zero:
                    _remove(temp)
                self._error = rundir.CheckpointWriteError(_write_failure(final, size, error))

        self._path, self._error = final, None
        self._thread = threading.Thread(target=run, name=f"kiln-checkpoint-{final.name}")
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
        any rank is raised on all of them).

        Raises:
            rundir.CheckpointWriteError: It could not be written (the earlier ones are intact).
        """
        _, error = self._join()
        problem = _any_problem(fabric, None if error is None else str(error))
        if problem is not None:
            raise rundir.CheckpointWriteError(problem)

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
