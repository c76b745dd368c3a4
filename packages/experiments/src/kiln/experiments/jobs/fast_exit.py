"""Ending a finished command's process without the interpreter's teardown."""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from typing import NoReturn

from kiln.experiments.upstream_internals import run_exit_handlers


def _threads_running() -> bool:
    return any(
        t.is_alive() and not t.daemon
        for t in threading.enumerate()
        if t is not threading.main_thread()
    )


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass  # closed or replaced: nothing left to write there


def end_process() -> None:
    """Run the exit handlers and end the process with status 0, unless threads still run.

    Everything a command writes is written by then: the exit handlers (``atexit``) run
    first: W&B's teardown, ``logging``'s flush, finalizers, a plugin's own; then stdout and
    stderr are flushed. What is skipped is Python's teardown of every module and object,
    which with torch, Lightning and transformers loaded takes seconds and writes nothing
    (measured in docs/benchmarks.md, "Other projects' private API"). With a non-daemon
    thread still running, it returns instead, and the interpreter waits for the thread.
    """
    if _threads_running():
        return
    run_exit_handlers()
    _flush()
    os._exit(0)


def end_interrupted(interrupt: KeyboardInterrupt) -> NoReturn:
    """End a command that ``KeyboardInterrupt`` stopped as the interpreter ends one: the
    traceback, the exit handlers, then death by SIGINT, which tells a shell or a launcher
    that the command was interrupted (status -2, or 130 in a shell).

    The interpreter's own path forgets
    the interrupt, and exits 1, when an exit handler runs code from a string: CPython 3.11
    does, and torch._dynamo's exit handler imports ``tabulate``, whose namedtuples do. With a
    non-daemon thread still running, it re-raises, and the interpreter waits for the thread.
    """
    if _threads_running():
        raise interrupt
    traceback.print_exception(interrupt)
    run_exit_handlers()
    _flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
    raise interrupt  # not reached: the signal ends the process
