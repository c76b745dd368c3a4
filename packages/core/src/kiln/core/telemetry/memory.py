"""What a run holds in memory: its per-rank state, counted exactly, and the fit's peak.

- :func:`state_bytes`: this rank's parameter, gradient and optimizer-state bytes. A sharded
  tensor (FSDP2's ``DTensor``) counts its local shard only, so under FSDP the figures are
  what each rank really holds (about 1/R of DDP's on R ranks).
- :func:`reset_peak_memory` (at the start of a fit) and :func:`device_peak_memory_mb`
  (at its end): the fit's own high-water mark, not one an earlier job of the same process
  (or, on the CPU, a parent process before ``exec``) left behind.
"""

from __future__ import annotations

import ctypes
import gc
import resource
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from kiln.core.dtensor import local_tensor
from kiln.core.telemetry.records import StateBytes

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def tensor_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes this rank holds for ``tensors`` (``None`` entries skipped, shared storages counted
    once, a ``DTensor`` by its local shard)."""
    seen: set[int] = set()
    total = 0
    for tensor in tensors:
        if tensor is None:
            continue
        storage = local_tensor(tensor).untyped_storage()
        if storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total


def grad_bytes(module: torch.nn.Module) -> int:
    """Bytes of the gradients ``module``'s parameters hold now (this rank's shard)."""
    return tensor_bytes(p.grad for p in module.parameters())


def state_bytes(module: torch.nn.Module, optimizer: Any) -> StateBytes:
    """This rank's ``param_bytes`` and ``optimizer_state_bytes`` (its shard under FSDP)."""
    tensors: list[torch.Tensor] = []
    for state in optimizer.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return {
        "param_bytes": tensor_bytes(module.parameters()),
        "optimizer_state_bytes": tensor_bytes(tensors),
    }


def status_kb(field: str) -> int | None:
    """A ``/proc/self/status`` figure in KiB (``VmRSS``, ``VmHWM``); ``None`` without it."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_cpu_peak() -> bool:
    """Reset the process's resident-set high-water mark (``VmHWM``) to its current RSS,
    after handing freed heap pages back to the OS. ``False`` where Linux's ``/proc`` is
    missing (the peak then stays the process's own since it started)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        _CLEAR_REFS.write_text("5")  # "5" resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        return False
    return True


def reset_peak_memory(device: torch.device) -> float | None:
    """Start counting ``device``'s peak memory from now (CUDA allocator or CPU RSS).

    Returns:
        What is held now, in MiB (CUDA: allocated tensors; CPU: the resident set), so the
        fit's own rise is its peak minus this; ``None`` where the CPU's is unknown.
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device) / 2**20
    if not reset_cpu_peak():
        return None
    rss_kb = status_kb("VmRSS")
    return None if rss_kb is None else rss_kb / 2**10


def device_peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process on ``device`` since :func:`reset_peak_memory`, in MiB.

    CUDA: the caching allocator's peak of allocated tensor memory on that device. Other
    devices: the process's peak resident set size (``VmHWM`` on Linux, else
    ``ru_maxrss``), which includes the Python runtime and libraries, not only tensors.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak_kb = status_kb("VmHWM")
    if peak_kb is not None:
        return peak_kb / 2**10
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is in KiB on Linux, in bytes on macOS
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10
