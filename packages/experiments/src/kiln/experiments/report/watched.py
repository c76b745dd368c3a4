"""What happened to the machine, and to the step times, through one run's measured steps.

A sample at a run's start and end misses a neighbour that ran for its middle. Each run
keeps the machine sampled through training (telemetry ``machine_series``,
:mod:`kiln.core.telemetry.sampler`) and its measured step times in order
(``step_times_s``); :func:`run_reasons` reads them and names the steps where

- other processes used :data:`OTHERS_LIMIT_CORES` or more cores,
- the job got less than :data:`OWN_SHARE_DROP` of its usual CPU (two samples or more),
- the GPU's SM clock fell below :data:`CLOCK_DROP` of the run's highest,
- the step time's level moved: the median of one of :data:`DRIFT_BLOCKS` consecutive
  blocks of steps lies more than :data:`DRIFT_MIN` from another's, with their moving-block
  bootstrap intervals apart;

and counts the steps that took over :data:`SLOW_STEP_FACTOR` times the median.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from kiln.experiments.bench.stats import block_median_interval

OTHERS_LIMIT_CORES = 1.0
"""Other processes using this many cores' worth of CPU during measured steps confound them."""
OWN_SHARE_DROP = 0.75
"""The job getting less than this share of its median CPU (cores) confounds its steps."""
CLOCK_DROP = 0.9
"""An SM clock below this share of the run's highest confounds its steps."""
SLOW_STEP_FACTOR = 2.0
"""A step over this many times the median is counted as slow."""
SPAN_GAP = 2
"""Flagged samples at most this many unflagged samples apart are one period."""
SPAN_MIN_SHARE = 0.05
"""A period shorter than this share of the measured window (or one sample) is not named: a
neighbour's second-long spike is the noise the intervals already carry."""
DRIFT_BLOCKS = 5
DRIFT_MIN = 0.05
"""Blocks' medians closer than this (relative) are not called a drift, however tight."""
_THROTTLES = {  # NVML clock event reasons worth naming (idle and app clocks are not news)
    0x4: "power cap",
    0x8: "hardware slowdown",
    0x20: "thermal",
    0x40: "hardware thermal",
    0x80: "power brake",
}


def _spans(
    flags: list[bool], starts: list[int], ends: list[int]
) -> list[tuple[int, int, list[int]]]:
    """Runs of flagged samples: (first step, last step, sample indices). A sample covers steps
    ``start + 1 .. end``; one with no step done covers the step in progress, ``start + 1``."""
    spans: list[tuple[int, int, list[int]]] = []
    for i, flagged in enumerate(flags):
        if not flagged:
            continue
        first, last = starts[i] + 1, max(ends[i], starts[i] + 1)
        if spans and i - spans[-1][2][-1] <= SPAN_GAP + 1:
            spans[-1] = (spans[-1][0], last, [*spans[-1][2], i])
        else:
            spans.append((first, last, [i]))
    return spans


def _lasting(
    spans: list[tuple[int, int, list[int]]], seconds: list[float]
) -> list[tuple[int, int, list[int]]]:
    """The periods long enough to name: two samples or more, and at least
    :data:`SPAN_MIN_SHARE` of the window's time."""
    total = sum(seconds) or float(len(seconds))
    return [
        span
        for span in spans
        if len(span[2]) >= 2
        and (span[2][-1] - span[2][0] + 1) * (total / len(seconds)) >= SPAN_MIN_SHARE * total
    ]


def _mean(values: list[float], seconds: list[float], picks: list[int]) -> float:
    total = sum(seconds[i] for i in picks)
    if total <= 0:
        return sum(values[i] for i in picks) / len(picks)
    return sum(values[i] * seconds[i] for i in picks) / total


def window_reasons(telemetry: dict[str, Any], name: str) -> list[str]:
    """Why ``telemetry``'s measured steps ran on a machine unlike itself (``name``: the run,
    in the reason: ``others used 1.9 cores during steps 400-1300 of the base run``)."""
    series = telemetry.get("machine_series") or {}
    columns: dict[str, list[Any]] = series.get("samples") or {}
    if not columns.get("step_end"):
        return []
    measured_from = int(series.get("measured_from_step") or 0)
    measured = telemetry.get("measured_steps")
    # samples after the last step (the final checkpoint's write) cover no measured step
    last = measured_from + measured if isinstance(measured, int) and measured > 0 else None
    keep = [
        i
        for i, end in enumerate(columns["step_end"])
        if max(end, columns["step_start"][i] + 1) > measured_from
        and (last is None or columns["step_start"][i] < last)
    ]
    cols = {k: [v[i] for i in keep] for k, v in columns.items()}
    starts = [max(s, measured_from) for s in cols["step_start"]]
    ends, seconds = cols["step_end"], cols.get("seconds") or [1.0] * len(keep)
    reasons: list[str] = []
    others = cols.get("other_cpu_cores") or []
    for first, last, picks in _lasting(
        _spans([o is not None and o >= OTHERS_LIMIT_CORES for o in others], starts, ends), seconds
    ):
        used = _mean(others, seconds, picks)
        reasons.append(f"others used {used:.1f} cores during steps {first}-{last} of {name}")
    own = [o for o in cols.get("own_cpu_cores") or [] if o is not None]
    if len(own) == len(keep) and own:
        usual = float(np.median(own))
        dropped = _spans([o < OWN_SHARE_DROP * usual for o in own], starts, ends)
        for first, last, picks in _lasting(dropped, seconds):
            got = _mean(own, seconds, picks)
            reasons.append(
                f"the job got {got:.1f} of its usual {usual:.1f} cores during steps "
                f"{first}-{last} of {name}"
            )
    clocks = cols.get("sm_clock_mhz") or []
    if clocks and all(isinstance(c, int | float) for c in clocks):
        top = max(clocks)
        throttles = cols.get("throttle_reasons") or [None] * len(clocks)
        fell = _spans([c < CLOCK_DROP * top for c in clocks], starts, ends)
        for first, last, picks in _lasting(fell, seconds):
            bits = 0
            for i in picks:
                bits |= throttles[i] or 0
            why = [text for bit, text in _THROTTLES.items() if bits & bit]
            because = f"; {', '.join(why)}" if why else ""
            low = min(clocks[i] for i in picks)
            reasons.append(
                f"SM clock fell to {low:.0f} MHz (from {top:.0f}{because}) during steps "
                f"{first}-{last} of {name}"
            )
    return reasons


def slow_steps(times: list[float]) -> str | None:
    """``"29 steps over 20 ms"`` (twice the median), or ``None`` when no step was slow."""
    if not times:
        return None
    limit = SLOW_STEP_FACTOR * float(np.median(times))
    slow = sum(t > limit for t in times)
    return f"{slow} steps over {limit * 1e3:.3g} ms" if slow else None


def drift_reason(telemetry: dict[str, Any], name: str) -> str | None:
    """Where the step time's level moved within the run (``None``: it did not)."""
    times = telemetry.get("step_times_s") or []
    if len(times) < 4 * DRIFT_BLOCKS:
        return None
    series = telemetry.get("machine_series") or {}
    first = int(series.get("measured_from_step") or 0) + 1
    stride = math.ceil((telemetry.get("measured_steps") or len(times)) / len(times))
    bounds = np.linspace(0, len(times), DRIFT_BLOCKS + 1).astype(int)
    blocks = [times[a:b] for a, b in itertools.pairwise(bounds)]
    medians = [float(np.median(b)) for b in blocks]
    low, high = int(np.argmin(medians)), int(np.argmax(medians))
    if medians[high] <= (1 + DRIFT_MIN) * medians[low]:
        return None
    if block_median_interval(blocks[low])[1] >= block_median_interval(blocks[high])[0]:
        return None  # their intervals meet: the move is within the noise

    def steps(k: int) -> str:
        return f"{first + bounds[k] * stride}-{first + (bounds[k + 1] - 1) * stride}"

    return (
        f"step time moved from {medians[low] * 1e3:.3g} ms (steps {steps(low)}) to "
        f"{medians[high] * 1e3:.3g} ms (steps {steps(high)}) in {name}"
    )


def drift_note(run: dict[str, Any], base: dict[str, Any]) -> str | None:
    """``"drift: <where>"`` when either job record's step time moved within its run, said
    beside a result: a level that moved on a quiet machine (a VM's neighbours, a clock's own
    steps) is in the moving-block interval already."""
    drifts = [
        d
        for name, record in (("this run", run), ("the base run", base))
        if (d := drift_reason(record.get("telemetry") or {}, name)) is not None
    ]
    return f"drift: {'; '.join(drifts)}" if drifts else None


def run_reasons(telemetry: dict[str, Any], name: str) -> list[str]:
    """What :func:`window_reasons` says confounded one run; when it says anything, how many
    of its steps were slow. A drift alone is no confounder (:func:`drift_reason`): the
    moving-block bootstrap widens the interval by it, and the verdict says it beside."""
    reasons = window_reasons(telemetry, name)
    if reasons and (slow := slow_steps(telemetry.get("step_times_s") or [])) is not None:
        reasons.append(f"{slow} in {name}")
    return reasons
