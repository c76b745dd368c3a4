"""The garbage collector around a command's start-up.

CPython runs a full collection whenever the objects it tracks have grown by a quarter since
the last one, and each scans every object alive. A training job's imports and set-up
(torch, Lightning, transformers, W&B, the model: 600k objects after the imports, 1M by the
first step) so trigger eight full
collections before the first step (counted in tests/experiments/test_startup.py), then the loop's
own ``gc.collect()`` (``kiln.core.telemetry.memory``) scans them once more; almost nothing
of it is garbage. So an entry point holds automatic collection off while it starts
(:func:`collection_held`), and the job freezes what start-up built just before its measured
work (:func:`startup_frozen`): from then on collections run as usual but skip those objects.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Generator

_held = False


@contextlib.contextmanager
def collection_held() -> Generator[None]:
    """Around a whole command: no automatic collection until a job's
    :func:`startup_frozen` (or the command's end, which restores the collector's state)."""
    global _held
    was_enabled, was_held = gc.isenabled(), _held
    gc.disable()
    _held = True
    try:
        yield
    finally:
        _held = was_held
        gc.unfreeze()
        (gc.enable if was_enabled else gc.disable)()


@contextlib.contextmanager
def startup_frozen() -> Generator[None]:
    """Around a job's measured work, inside :func:`collection_held`: what exists now is frozen
    out of collections and automatic collection runs again. Afterwards the frozen objects
    are collectable again: in a sweep's later jobs in the same process, garbage an earlier
    job left that no collection reached before the next job froze it waits at most until that
    job ends. Outside :func:`collection_held` (``run_job`` called from Python),
    nothing changes."""
    if not _held:
        yield
        return
    gc.freeze()
    gc.enable()
    try:
        yield
    finally:
        gc.unfreeze()
