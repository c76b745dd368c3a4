"""Peak memory of one training step, on CUDA exactly and on the CPU approximately.

Both variants of a benchmark live in one process, so a raw process-wide peak would count
the other variant's weights too. A variant's peak is therefore measured as

    its own persistent state (parameters, gradients, optimizer state, counted exactly)
    + the peak allocation of one of its steps above what was allocated before the step.

On CUDA the step's part is ``torch.cuda.max_memory_allocated`` (reset before the step)
minus ``memory_allocated`` before it. On the CPU there is no allocator counter, so it is
the rise of the process's resident set: Linux's high-water mark (``VmHWM``) is reset
through ``/proc/self/clear_refs`` and glibc is asked to hand freed memory back
(``malloc_trim``) before the step, and the step's part is ``VmHWM`` after it minus
``VmRSS`` before it. That includes allocator slack and anything else the process touched
meanwhile, so CPU figures are approximate; without ``/proc`` they are ``None``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kiln.core.telemetry.memory import reset_cpu_peak, status_kb, tensor_bytes

_MB = 2**20


def persistent_bytes(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Parameters, buffers, gradients and optimizer state of one benchmark variant."""
    tensors: list[torch.Tensor | None] = [*module.parameters(), *module.buffers()]
    tensors += [p.grad for p in module.parameters()]
    for state in optimizer.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return tensor_bytes(tensors)


def step_peak_bytes(step: Callable[[], object], device: torch.device) -> int | None:
    """Run ``step`` once; return its peak allocation above what was allocated before it.

    Args:
        step: One training step of the variant being measured.
        device: Where it runs: CUDA uses the caching allocator's counters, anything else
            the process's resident set (approximate, ``None`` where Linux's ``/proc`` is missing).
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        torch.cuda.synchronize(device)
        return max(torch.cuda.max_memory_allocated(device) - before, 0)
    if not reset_cpu_peak():
        step()
        return None
    before_kb = status_kb("VmRSS")
    step()
    peak_kb = status_kb("VmHWM")
    if before_kb is None or peak_kb is None:
        return None
    return max(peak_kb - before_kb, 0) * 1024


def variant_peak_memory_mb(
    step: Callable[[], object],
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    steps: int = 2,
) -> float | None:
    """A variant's peak memory in MiB: persistent state + the largest of ``steps`` step peaks."""
    peaks = [step_peak_bytes(step, device) for _ in range(steps)]
    if any(p is None for p in peaks):
        return None
    return (persistent_bytes(module, optimizer) + max(peaks)) / _MB  # type: ignore[type-var]
