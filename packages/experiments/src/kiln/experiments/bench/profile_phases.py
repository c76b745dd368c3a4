"""``bench.profile_steps``: the eager and the compiled variant profiled, one trace each.

After the timed pairs, each variant runs ``steps`` more steps (plus one the profiler warms
up on) under ``torch.profiler``: ``<job dir>/profile_eager/trace.json`` and
``profile_compiled/trace.json`` (Perfetto), and each step's
:class:`~kiln.core.telemetry.profile.StepBreakdown` for kiln-report's side-by-side view.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kiln.core import step_breakdown


def profile_variant(
    step: Callable[[], None], device: torch.device, steps: int, directory: Path
) -> dict[str, Any]:
    """Profile ``steps`` calls of ``step`` (after one warm-up call) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    trace = directory / "trace.json"
    found: dict[str, Any] = {}

    def ready(profiler: torch.profiler.profile) -> None:
        profiler.export_chrome_trace(str(trace))
        result = step_breakdown(profiler.events())
        found["breakdown"] = dataclasses.asdict(result) if result else None

    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=steps, repeat=1)
    with torch.profiler.profile(
        activities=activities, schedule=schedule, on_trace_ready=ready
    ) as profiler:
        for _ in range(steps + 1):
            step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # the step's kernels inside its profiled span
            profiler.step()
    return {"trace": str(trace), **found}
