"""The one place kiln.core uses another project's private API, each with why it is kept.

- ``torch._logging._internal`` (:func:`structured_trace`): torch's structured compile trace
  has one public switch, ``TORCH_TRACE``, read once when torch is imported, for the whole
  process. A Hydra sweep runs its jobs in one process, and ``compile.trace=true`` gives each
  job its own trace (and tlparse report) in its own directory: that needs a trace handler
  per job, which only the private module provides.
- ``torch.cuda.memory._record_memory_history`` / ``_dump_snapshot``
  (:func:`record_memory_history`, :func:`dump_memory_snapshot`): the allocator history that
  PyTorch's memory viewer (pytorch.org/memory_viz) reads; torch documents it only under
  these names ("Understanding CUDA Memory Usage").

``tests/test_upstream_internals.py`` fails when one of these names moves upstream, and when
any other kiln module imports a private name of torch, Lightning, Hydra or W&B.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from contextlib import contextmanager

_TRACE_ENV = "TORCH_TRACE"


@contextmanager
def structured_trace(directory: str | os.PathLike[str]) -> Generator[None, None, None]:
    """Write torch's structured compile trace into ``directory`` while the block runs.

    What ``TORCH_TRACE=<directory>`` does for a whole process, for this block: this process
    logs through a trace handler of its own (the one torch installs at import), and processes
    started inside the block (workers) inherit ``TORCH_TRACE``. One file per process,
    ``dedicated_log_torch_trace_*.log``; ``tlparse <file>`` makes an HTML report of it.
    """
    from torch._logging._internal import LazyTraceHandler, TorchLogsFormatter, trace_log

    os.makedirs(directory, exist_ok=True)
    handler = LazyTraceHandler(os.fspath(directory))
    handler.setFormatter(TorchLogsFormatter(trace=True))
    previous = os.environ.get(_TRACE_ENV)
    os.environ[_TRACE_ENV] = os.fspath(directory)
    trace_log.addHandler(handler)
    try:
        yield
    finally:
        trace_log.removeHandler(handler)
        handler.close()
        if previous is None:
            os.environ.pop(_TRACE_ENV, None)
        else:
            os.environ[_TRACE_ENV] = previous


def record_memory_history(enabled: bool) -> None:
    """Start (or stop and clear) recording the CUDA allocator's history."""
    import torch

    if enabled:
        torch.cuda.memory._record_memory_history(max_entries=100_000)  # pyright: ignore[reportPrivateUsage, reportUnknownMemberType]
    else:
        torch.cuda.memory._record_memory_history(enabled=None)  # pyright: ignore[reportPrivateUsage, reportUnknownMemberType]


def dump_memory_snapshot(path: str | os.PathLike[str]) -> None:
    """Write the recorded allocator history where PyTorch's memory viewer reads it."""
    import torch

    torch.cuda.memory._dump_snapshot(os.fspath(path))  # pyright: ignore[reportPrivateUsage]
