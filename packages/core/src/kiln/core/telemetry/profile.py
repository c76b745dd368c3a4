"""Where a profiled step's time goes, by what a researcher reads at a glance.

``torch.profiler`` records every op of a few steps with its parent; each op's own time (its
self time, so nothing counts twice) goes to the first category its name or an enclosing
op's name falls in (``aten::copy_`` inside ``aten::addmm`` is matmul time; any op inside
``Optimizer.step`` is optimizer time). Whatever the ops do not cover of the step's wall time
is host overhead (Python, the loop, launch latency) or, on a GPU, idle.

The loop marks its work outside the step timer (fetching the next window, logging,
validation, checkpoints) with a ``BETWEEN_STEPS`` range: that time is kept apart
(``between_steps_ms``, by category), so the categories add up to the step the loop's own
timer measures.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "communication",
        (
            "nccl",
            "gloo",
            "c10d",
            "all_reduce",
            "allreduce",
            "all_gather",
            "allgather",
            "reduce_scatter",
            "broadcast",
            "record_param_comms",
        ),
    ),
    ("optimizer", ("optimizer.", "_fused_adam", "_fused_sgd", "_foreach_", "zero_grad")),
    ("data and host-to-device copies", ("dataloader", "memcpy htod", "pin_memory")),
    (
        "compiled regions",
        (
            "compiledfunction",
            "torch-compiled region",
            "compiledfxgraph",
            "compiled fx graph",
            "triton_",
            "cpp_fused",
            "inductor",
        ),
    ),
    (
        "attention",
        ("scaled_dot_product", "flash", "efficient_attention", "attention"),
    ),
    (
        "matmul and linear",
        (
            "addmm",
            "aten::mm",
            "mmbackward",
            "bmm",
            "matmul",
            "linear",
            "conv",
            "gemm",
            "cutlass",
            "xmma",
            "cublas",
        ),
    ),
)
"""Each category and the name parts (lower case) that put an op in it, checked in order."""
ELEMENTWISE = "normalisation and elementwise"
HOST = "host overhead and idle"
BETWEEN_STEPS = "kiln: between steps"
"""The profiler range around the loop's work outside the timed step."""
CATEGORY_ORDER = (*(name for name, _ in CATEGORIES), ELEMENTWISE, HOST)
"""The categories of a breakdown, in the order reports print them."""


@dataclass
class StepBreakdown:
    """One profiled step, on average: milliseconds per category (host wall time; on CUDA
    also the device's kernel time), and the ops (and kernels) it launched."""

    steps: int
    step_ms: float
    """The profiled steps' mean wall time, without the loop's work between steps: what the
    loop's step timer measures."""
    host_ms: dict[str, float] = field(default_factory=dict[str, float])
    device_ms: dict[str, float] = field(default_factory=dict[str, float])
    ops_per_step: float = 0.0
    """Top-level ``aten::`` ops (an op called inside another is not counted again)."""
    kernels_per_step: float = 0.0
    """Device kernels (CUDA only; 0 on the CPU)."""
    between_steps_ms: dict[str, float] = field(default_factory=dict[str, float])
    """The loop's work outside the timed step, by category (data fetch, logging, ...)."""


def _category_of(name: str) -> str | None:
    lower = name.lower()
    for category, parts in CATEGORIES:
        if any(part in lower for part in parts):
            return category
    return None


def _is_op(name: str) -> bool:
    return name.startswith(("aten::", "autograd::")) or "Backward" in name


def categorize(event: Any) -> str:
    """The category of one profiler event: its own name's or the nearest enclosing one's
    (up to the ``ProfilerStep``); an op of no category is elementwise, anything else host."""
    node = event
    while node is not None and not node.name.startswith("ProfilerStep"):
        category = _category_of(node.name)
        if category is not None:
            return category
        node = node.cpu_parent
    return ELEMENTWISE if _is_op(event.name) else HOST


def _between_steps(event: Any) -> bool:
    node = event
    while node is not None and not node.name.startswith("ProfilerStep"):
        if node.name == BETWEEN_STEPS:
            return True
        node = node.cpu_parent
    return False


def step_breakdown(events: Any) -> StepBreakdown | None:
    """The per-step breakdown of a profiler's ``events()`` (``None`` without a whole step)."""
    steps = [e for e in events if e.name.startswith("ProfilerStep")]
    if not steps:
        return None
    n = len(steps)
    step_us = sum(e.cpu_time_total for e in steps) / n
    host: defaultdict[str, float] = defaultdict(float)
    device: defaultdict[str, float] = defaultdict(float)
    between: defaultdict[str, float] = defaultdict(float)
    ops = kernels = 0
    for event in events:
        if event.name.startswith("ProfilerStep"):
            continue
        if getattr(event.device_type, "name", "CPU") != "CPU":
            kernels += 1
            continue
        category = categorize(event)
        if _between_steps(event):
            # the range's own self time is the loop's Python between steps
            between[HOST if event.name == BETWEEN_STEPS else category] += event.self_cpu_time_total
            continue
        host[category] += event.self_cpu_time_total
        device[category] += getattr(event, "self_device_time_total", 0.0)
        parent = event.cpu_parent
        if event.name.startswith("aten::") and (parent is None or not _is_op(parent.name)):
            ops += 1
    step_us -= sum(between.values()) / n
    host[HOST] += max(step_us * n - sum(host.values()), 0.0)  # what no op covered
    return StepBreakdown(
        steps=n,
        step_ms=step_us / 1e3,
        host_ms={c: host[c] / n / 1e3 for c in CATEGORY_ORDER if host[c]},
        device_ms={c: device[c] / n / 1e3 for c in CATEGORY_ORDER if device[c]},
        ops_per_step=ops / n,
        kernels_per_step=kernels / n,
        between_steps_ms={c: between[c] / n / 1e3 for c in CATEGORY_ORDER if between[c]},
    )


def profiler_activities(device_type: str) -> list[Any]:
    """What ``torch.profiler`` records on ``device_type``: the host, and CUDA's kernels."""
    from torch.profiler import ProfilerActivity

    cuda = [ProfilerActivity.CUDA] if device_type == "cuda" else []
    return [ProfilerActivity.CPU, *cuda]


def write_profile(profiler: Any, directory: Path) -> dict[str, Any]:
    """A finished profile's Chrome/Perfetto trace (``directory/trace.json``) and its
    :func:`step_breakdown`, as ``{"trace", "breakdown"}``."""
    trace = directory / "trace.json"
    profiler.export_chrome_trace(str(trace))
    found = step_breakdown(profiler.events())
    return {"trace": str(trace), "breakdown": dataclasses.asdict(found) if found else None}
