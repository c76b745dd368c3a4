"""``bench.profile_steps``: the eager and the compiled variant profiled, one trace each.

After the timed pairs, each variant runs ``steps`` more steps (plus one the profiler warms
up on) under ``torch.profiler``: ``<job dir>/profile_eager/trace.json`` and
``profile_compiled/trace.json`` (Perfetto), and each step's
:class:`~kiln.core.telemetry.profile.StepBreakdown` for kiln-report's side-by-side view.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kiln.core.telemetry.profile import profiler_activities, write_profile


def profile_variant(
    step: Callable[[], None], device: torch.device, steps: int, directory: Path
) -> dict[str, Any]:
    """Profile ``steps`` calls of ``step`` (after one warm-up call) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    written: dict[str, Any] = {}

    def ready(profiler: torch.profiler.profile) -> None:
        written.update(write_profile(profiler, directory))

    schedule = torch.profiler.schedule(wait=0, warmup=1, active=steps, repeat=1)
    with torch.profiler.profile(
        activities=profiler_activities(device.type), schedule=schedule, on_trace_ready=ready
    ) as profiler:
        for _ in range(steps + 1):
            step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # the step's kernels inside its profiled span
            profiler.step()
    return written
