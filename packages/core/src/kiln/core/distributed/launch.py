"""Run a function in several local processes with torch's elastic launch API.

Unlike Fabric's default launcher, nothing re-executes ``sys.argv``: the agent spawns fresh
interpreters that import the function by reference and call it, so a Hydra entry point or
a test can start a multi-process run from inside Python. The workers get the torchrun
environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), which
Fabric's ``ddp`` strategy picks up.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import tempfile
import uuid
from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import Any, cast

from lightning.fabric.plugins.environments.slurm import SLURMEnvironment
from lightning.fabric.plugins.environments.torchelastic import TorchElasticEnvironment
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from kiln.core.atomic import atomic_write
from kiln.core.distributed.stop import (
    follow_agent,
    ignore_repeated_signals,
    requested_signal,
    signal_handlers_restored,
)
from kiln.core.distributed.threads import default_threads_per_rank


class WorkerFailedError(RuntimeError):
    """A launched worker process failed; the message carries its error and traceback."""


class WorldSizeError(RuntimeError):
    """The processes that joined the job are not the ``devices x num_nodes`` the config asks for."""


def launched_externally() -> bool:
    """Whether this process was started by torchrun, SLURM or another launcher that sets
    ``LOCAL_RANK`` and ``WORLD_SIZE``: then it is already one rank of the job."""
    has_rank_env = "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ
    return has_rank_env or TorchElasticEnvironment.detect() or SLURMEnvironment.detect()


def check_world_size(fabric: Any, trainer: Any) -> None:
    """Fail unless the job runs on the ``trainer.devices x num_nodes`` processes it asks for.

    Inside a SLURM allocation Fabric takes the world size from SLURM (``SLURM_NTASKS``), not from
    the config: an ``sbatch --ntasks=1`` job with ``trainer.devices=2`` would train on one
    process while everything recorded says two. Call it once Fabric is built, on every rank.

    Args:
        fabric: The job's ``lightning.Fabric``.
        trainer: The ``kiln.core.TrainerConfig`` (``devices`` and ``num_nodes``).

    Raises:
        WorldSizeError: The numbers differ; the message names both and how to fix the launch.
    """
    world, devices, nodes = fabric.world_size, trainer.devices, trainer.num_nodes
    if world == devices * nodes:
        return
    if SLURMEnvironment.detect():
        tasks = os.environ.get("SLURM_NTASKS", "?")
        slurm_nodes = os.environ.get("SLURM_NNODES", "?")
        how = (
            f"SLURM started {tasks} task(s) on {slurm_nodes} node(s): submit with "
            f"--nodes={nodes} --ntasks-per-node={devices} (launcher=slurm does), or set "
            f"trainer.devices and trainer.num_nodes to the tasks SLURM starts"
        )
    elif TorchElasticEnvironment.detect():
        how = (
            f"torchrun started WORLD_SIZE={os.environ.get('WORLD_SIZE', '?')} processes: run "
            f"torchrun --nnodes={nodes} --nproc-per-node={devices}, or set trainer.devices and "
            f"trainer.num_nodes to match"
        )
    else:
        how = "start one process per device (kiln.core.launch, torchrun or SLURM)"
    raise WorldSizeError(
        f"the job runs on {world} process(es) (fabric.world_size={world}) but "
        f"trainer.devices={devices} x trainer.num_nodes={nodes} asks for {devices * nodes}; "
        f"{how}"
    )


# torch's elastic agent installs its own handlers for these and leaves them: without putting
# ours back, Ctrl-C after a launch would raise its SignalException, not KeyboardInterrupt
_ELASTIC_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


@contextmanager
def _main_not_reimported(fn: Callable[..., Any]) -> Generator[None, None, None]:
    """Keep spawned workers from re-running the ``__main__`` script.

    ``multiprocessing``'s spawn imports the parent's main module in every child (as
    ``__mp_main__``), which re-runs a script's unguarded top-level code. Workers only need
    ``fn``'s own module, so unless ``fn`` lives in ``__main__`` the main module is hidden
    from spawn while the workers start.
    """
    main = sys.modules.get("__main__")
    if main is None or getattr(fn, "__module__", None) == "__main__":
        yield
        return
    saved = {
        name: main.__dict__[name] for name in ("__file__", "__spec__") if name in main.__dict__
    }
    main.__spec__ = None
    main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        main.__dict__.update(saved)


@contextmanager
def _worker_threads(nprocs: int) -> Generator[None, None, None]:
    """Give each worker an equal share of the cores this process may use, as torchrun does.

    Workers inherit the parent's environment when they are spawned; without a limit each
    would start one compute thread per core and they would oversubscribe the machine. This
    is only where a worker starts: ``fit`` sets the threads its rank computes with
    (``trainer.threads_per_rank``) whatever the launcher gave it.
    """
    if "OMP_NUM_THREADS" in os.environ:
        yield
        return
    os.environ["OMP_NUM_THREADS"] = str(default_threads_per_rank(nprocs, 1))
    try:
        yield
    finally:
        del os.environ["OMP_NUM_THREADS"]


def _describe_failure(error: ChildFailedError) -> str:
    rank, failure = error.get_first_failure()
    message = failure.message
    if isinstance(message, dict):  # the error file written by @record: message and traceback
        record = cast(dict[str, Any], message)
        text: str = record.get("message", "")
        trace: str = record.get("extraInfo", {}).get("py_callstack", "")
        message = f"{trace}\n{text}" if trace and text not in trace else trace or text
    if not message:
        message = f"exit code {failure.exitcode} (no error recorded: killed, or crashed in C++?)"
    others = sorted(r for r in error.failures if r != rank)
    also = f" (ranks {others} failed too)" if others else ""
    return f"worker rank {rank} of the launched job failed{also}:\n{message}"


def _check_importable(fn: Callable[..., Any]) -> None:
    """Workers import ``fn`` by reference: a lambda or a nested function cannot be."""
    if (
        getattr(fn, "__qualname__", "").count("<locals>")
        or getattr(fn, "__name__", "") == "<lambda>"
    ):
        raise ValueError(
            f"launch needs a top-level function that worker processes can import; "
            f"{getattr(fn, '__qualname__', fn)!r} is a lambda or defined inside a function"
        )


def _worker(fn: Callable[..., Any], results_dir: str, parent: int, *args: Any) -> Any:
    """A worker's entry point: ``fn(*args)`` in its own process group, so a terminal's Ctrl-C
    reaches the agent alone and each worker gets the signal once, from the agent's relay.

    If the agent's process dies (SIGKILL, out of memory), torch's parent-death signal
    (SIGINT, once per exiting thread of the agent's process) stops the worker's ``fit`` at
    the next step boundary, with a checkpoint there; it does not train on, orphaned.

    A worker whose ``fit`` stopped for a signal (``kiln.core.distributed.stop``) hands its
    result over in ``results_dir`` and ends by that signal: the agent is shutting the workers
    down (or will, once one ends), reads no result and would wait 30 s before killing it.
    """
    os.setpgrp()
    ignore_repeated_signals()
    follow_agent(parent)
    result = fn(*args)
    signum = requested_signal()
    if signum:
        if os.getppid() == parent:  # the agent is there to read it
            path = os.path.join(results_dir, f"rank-{os.environ['LOCAL_RANK']}.pkl")
            atomic_write(path, pickle.dumps(result))
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)
    return result


def _stopped_results(results_dir: str, nprocs: int) -> list[Any] | None:
    """The results every worker handed over after a signal stopped it, in rank order, or
    ``None`` when some worker did not (it died before, or the signal came outside ``fit``)."""
    paths = [os.path.join(results_dir, f"rank-{rank}.pkl") for rank in range(nprocs)]
    if not all(os.path.exists(path) for path in paths):
        return None
    results: list[Any] = []
    for path in paths:
        with open(path, "rb") as f:
            results.append(pickle.load(f))
    return results


def _launch_config(nprocs: int) -> LaunchConfig:
    """One node, ``nprocs`` spawned workers, no restarts, a c10d rendezvous on localhost."""
    return LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nprocs,
        run_id=f"kiln-{uuid.uuid4().hex[:12]}",
        rdzv_backend="c10d",
        # port 0: the rendezvous store binds a free port itself (as torchrun --standalone),
        # so no other process can take it between choosing and binding
        rdzv_endpoint="127.0.0.1:0",
        local_addr="127.0.0.1",
        max_restarts=0,
        start_method="spawn",
        monitor_interval=0.1,
    )


def launch(fn: Callable[..., Any], nprocs: int, *args: Any) -> list[Any]:
    """Run ``fn(*args)`` in ``nprocs`` local processes and return their results in rank order.

    Uses ``torch.distributed.launcher.api.elastic_launch`` with a c10d rendezvous on a
    localhost port its store picks (port 0, as ``torchrun --standalone``), spawned workers
    and no restarts. Inside ``fn``, a Fabric with ``devices=nprocs`` and the ``ddp``
    strategy joins the process group (gloo on the CPU).

    With ``nprocs == 1``, or when this process is already one rank of a job started by
    torchrun or SLURM, ``fn(*args)`` runs here, in-process, and its result is returned as
    ``[result]``.

    Workers import ``fn`` by reference and never run ``sys.argv`` again; if ``fn`` is defined in
    the ``__main__`` script, that script must guard its entry point with
    ``if __name__ == "__main__":``, as for any spawned process.

    Args:
        fn: A picklable top-level function (workers import it by reference).
        nprocs: Processes to start on this machine.
        *args: Picklable arguments passed to ``fn`` on every rank.

    Returns:
        ``fn``'s return value on each local rank, in rank order; also when a signal stopped
        every worker's ``fit`` at the same step boundary (``kiln.core.distributed.stop``: SIGTERM or
        Ctrl-C to this process, which torch's agent relays, or a signal to one worker), so
        the caller sees ``stop_signal`` and acts on it as a single process would.

    Raises:
        WorkerFailedError: A worker failed; the message holds its exception and traceback.
        SignalException: torch's: this process got a signal that no worker's ``fit`` could
            turn into a stop (it came before or after the step loop).
    """
    # any value may come in: the annotation is not enforced at run time
    if not isinstance(nprocs, int) or nprocs < 1:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError(f"nprocs={nprocs!r} is not valid; it must be an integer >= 1")
    if nprocs == 1 or launched_externally():
        return [fn(*args)]
    _check_importable(fn)
    config = _launch_config(nprocs)
    with (
        tempfile.TemporaryDirectory(prefix="kiln-launch-") as results_dir,
        _main_not_reimported(fn),
        _worker_threads(nprocs),
        signal_handlers_restored(_ELASTIC_SIGNALS),
    ):
        try:
            results = elastic_launch(config, _worker)(fn, results_dir, os.getpid(), *args)
        except (ChildFailedError, SignalException) as error:
            stopped = _stopped_results(results_dir, nprocs)
            if stopped is not None:  # every rank stopped at the same step boundary
                return stopped
            if isinstance(error, SignalException):
                raise
            raise WorkerFailedError(_describe_failure(error)) from None
    return [results[rank] for rank in sorted(results)]
