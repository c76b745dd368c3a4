"""Run a kiln command (``kiln-train``, ``kiln-bench``, ``kiln-report``, ``kiln-eval``,
``kiln-export``) in this test process, as its console script runs it but for the process: the
same ``sys.argv``, environment and working directory, its stdout and stderr captured,
``SystemExit`` turned into a return code; or, for the tests whose point is the process, in a
fresh interpreter.

A fresh interpreter costs each test 6-10 s of imports (torch, Lightning, transformers) before
its few steps; the tests whose point is the process itself (exit status of the console
script, signals, SIGKILL, worker launches, start-up imports, entry points) start one instead.

Between commands the process is left as a user running two commands would find it: Hydra's
global state cleared, the logging handlers a job added removed, dynamo's caches reset, the
environment, working directory, ``sys.path`` and torch's global flags as they were.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def _process_like(argv: list[str], env: dict[str, str], cwd: str) -> Iterator[None]:
    """``sys.argv``, ``os.environ`` (``env`` on top) and the working directory set for one
    command, and the global state a command changes restored afterwards."""
    import torch
    from hydra.core.global_hydra import GlobalHydra

    saved_argv, saved_path, saved_cwd = sys.argv[:], sys.path[:], os.getcwd()
    saved_env = dict(os.environ)
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    saved_torch = (
        torch.get_default_dtype(),
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.get_float32_matmul_precision(),
        torch.get_num_threads(),
    )
    GlobalHydra.instance().clear()
    sys.argv = argv
    os.environ.update(env)
    if "OMP_NUM_THREADS" in env:  # what a fresh interpreter's torch starts with
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    os.chdir(cwd)
    try:
        yield
    finally:
        import wandb

        # what the process's exit does (W&B's atexit hook): finish open runs, wait until the
        # service has written every run's file, end the service (the next command starts one)
        wandb.teardown()
        GlobalHydra.instance().clear()
        torch._dynamo.reset()
        dtype, deterministic, warn_only, matmul, threads = saved_torch
        torch.set_default_dtype(dtype)
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        torch.set_float32_matmul_precision(matmul)
        torch.set_num_threads(threads)
        # Hydra's job logging replaced the root handlers with its own (writing to this
        # command's captured streams and its job dir's log file): close them, put ours back
        for handler in root.handlers:
            if handler not in saved_handlers:
                handler.close()
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        os.chdir(saved_cwd)
        sys.path[:] = saved_path
        os.environ.clear()
        os.environ.update(saved_env)
        os.environ.pop("WANDB_SERVICE", None)  # the service it names has ended
        sys.argv = saved_argv


@contextlib.contextmanager
def _streams(out: io.StringIO, err: io.StringIO) -> Iterator[None]:
    """stdout and stderr into ``out`` and ``err``: ``sys.stdout``/``sys.stderr``, warnings
    (which pytest would otherwise record instead of printing), and the stream handlers that
    libraries attached to the process's streams at import (Lightning's, Hydra's)."""
    import warnings

    moved = []
    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        for handler in getattr(logger, "handlers", []):
            stream = getattr(handler, "stream", None)
            if type(handler) is logging.StreamHandler and stream in (sys.stdout, sys.stderr):
                moved.append((handler, stream))
                handler.setStream(out if stream is sys.stdout else err)

    def show(message, category, filename, lineno, file=None, line=None):
        err.write(warnings.formatwarning(message, category, filename, lineno, line))

    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            with warnings.catch_warnings():
                warnings.showwarning = show
                yield
    finally:
        for handler, stream in moved:
            handler.setStream(stream)


def run_in_process(
    main: Callable[[], Any], argv: list[str], env: dict[str, str], cwd: str
) -> subprocess.CompletedProcess:
    """Run ``main`` (a command's ``main`` without its process ending) with ``sys.argv`` set to
    ``argv``, ``env`` added to the environment and ``cwd`` as the working directory.

    Returns:
        What :func:`subprocess.run` with ``capture_output=True, text=True`` would: the exit
        status (``SystemExit``'s code, 1 for an exception that escaped ``main``), stdout and
        stderr.
    """
    out, err = io.StringIO(), io.StringIO()
    code: Any = 0
    with _process_like(argv, env, cwd), _streams(out, err):
        try:
            returned = main()
            code = returned if isinstance(returned, int) else 0
        except SystemExit as exit_:
            code = exit_.code
        except Exception:  # what the interpreter does with an uncaught exception
            import traceback

            traceback.print_exc()
            code = 1
        finally:
            for handler in logging.getLogger().handlers:
                handler.flush()
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): printed to stderr, status 1
        err.write(f"{code}\n")
        code = 1
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def user_env() -> dict[str, str]:
    """This process's environment as a user's shell would hand it to a command: without
    ``WANDB_SERVICE``, which W&B sets here once a test opened a run in-process (a child that
    inherits it shares this process's W&B service, and a killed child's run stays in use)."""
    return {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}


def _main(command: str, argv: list[str]) -> Callable[[], Any]:
    """``kiln-<command>``'s console script entry point without its process ending."""
    cli = importlib.import_module(f"kiln.experiments.{command}.cli")
    if command == "train":
        from kiln.experiments.settings.compose import run_hydra_app

        # cli.main() ends the process (fast_exit.end_process): the rest of it
        return lambda: run_hydra_app(cli.task, "train", cli.register_configs)
    if command == "bench":
        return cli.main  # Hydra reads sys.argv
    return lambda: cli.main(argv)


def kiln_command(
    command: str,
    args: list[str],
    env: dict[str, str] | None = None,
    cwd: Path | str | None = None,
    process: bool = False,
    timeout: float = 600,
) -> subprocess.CompletedProcess:
    """``kiln-<command> args`` with ``env`` added to the environment, in ``cwd`` (default: this
    process's): in this process, or with ``process=True`` in a fresh interpreter
    (``timeout`` applies to that one only).

    A ``PYTHONPATH`` in ``env`` (a plugin on the path) needs ``process=True``: this process
    would keep the plugin imported, and its models registered, for every later test.
    """
    env, cwd = env or {}, str(cwd or os.getcwd())
    module = f"kiln.experiments.{command}"
    if process:
        return subprocess.run(
            [sys.executable, "-m", module, *args],
            env={**user_env(), **env},
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    assert "PYTHONPATH" not in env, f"a plugin on PYTHONPATH: kiln-{command} needs process=True"
    # what ``python -m kiln.experiments.<command>`` has as sys.argv[0]
    main_file = str(Path(importlib.import_module(module).__file__).parent / "__main__.py")
    return run_in_process(_main(command, args), [main_file, *args], env, cwd)
