"""Ending a finished command's process without the interpreter's teardown."""

from __future__ import annotations

import os
import sys
import threading

from kiln.experiments.upstream_internals import run_exit_handlers


def end_process() -> None:
    """Run the exit handlers and end the process with status 0, unless threads still run.

    Everything a command writes is written by then: the exit handlers (``atexit``) run
    first: W&B's teardown, ``logging``'s flush, finalizers, a plugin's own; then stdout and
    stderr are flushed. What is skipped is Python's teardown of every module and object,
    which with torch, Lightning and transformers loaded takes seconds and writes nothing
    (measured in docs/benchmarks-peers.md). With a non-daemon thread still running, it
    returns instead, and the interpreter waits for the thread as usual.
    """
    if any(
        t.is_alive() and not t.daemon
        for t in threading.enumerate()
        if t is not threading.main_thread()
    ):
        return
    run_exit_handlers()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass  # closed or replaced: nothing left to write there
    os._exit(0)
