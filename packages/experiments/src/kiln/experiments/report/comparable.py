"""Whether two jobs' times can be divided: same hardware, alike calibration, alike load.

A ratio of two jobs' step times (a speedup, a scaling efficiency) measures the change in
config only when nothing else changed between them. Each job records its machine
(:func:`kiln.experiments.settings.job_info.machine_info`), the load before and after, a
calibration (a fixed matmul and copy benchmark) before and after training, and the machine
sampled through training; :func:`verdict` compares two such records, reads each run's
measured window (:mod:`kiln.experiments.report.watched`) and says why the ratio is not a
result, if it is not.
"""

from __future__ import annotations

from typing import Any, Literal

from kiln.core.telemetry.machine import FINGERPRINT_KEYS
from kiln.core.telemetry.records import Calibration, GpuLoad
from kiln.experiments.report.watched import OTHERS_LIMIT_CORES, drift_note, run_reasons
from kiln.experiments.settings.job_info import JobMachine

CALIBRATION_TOLERANCE = 0.2
"""Calibrations agree when one is within a factor ``1 + CALIBRATION_TOLERANCE`` of the other
(both runs' before/after calibrations, matmul and copy)."""
LOAD_TOLERANCE_CORES = 1.0
"""Other processes' CPU use (cores' worth) may differ by at most this between two runs."""
IMPOSSIBLE_EFFICIENCY = 1.05
"""A scaling efficiency above this on the same hardware cannot be true: a measurement symptom."""
TRUST_RULE = (
    f"a ratio of two runs is a result only when both recorded their machine, with the same "
    f"fingerprint ({', '.join(FINGERPRINT_KEYS)}; across ranks per node, the same threads per "
    f"rank or per node), calibrations (matmul, copy; before and "
    f"after training) within {1 + CALIBRATION_TOLERANCE:.2f}x of each other, other processes' "
    f"CPU use differing by at most {LOAD_TOLERANCE_CORES:g} core and using fewer cores than the "
    f"job may use, at the edges and through the measured steps (others under "
    f"{OTHERS_LIMIT_CORES:g} core, the job's own CPU and the GPU clock steady, the step time's "
    f"level unmoved); otherwise it is `confounded: <reason>` and left out of means; a scaling "
    f"efficiency above {IMPOSSIBLE_EFFICIENCY} is confounded"
)
_NAMES = {
    "hostname": "host",
    "cpu_model": "CPU",
    "affinity_cores": "cores",
    "gpu_names": "GPU",
    "gpu_driver": "GPU driver",
    "torch": "torch",
}
_CALIBRATION_RATES = ("matmul_gflop_per_s", "copy_gb_per_s")


def _other_cores(machine: JobMachine) -> float | None:
    """The most cores' worth of CPU other processes used, at the job's start or end."""
    loads = [machine.get("load_start"), machine.get("load_end")]
    values = [load.get("other_cpu_cores") for load in loads if load]
    values = [v for v in values if isinstance(v, int | float)]
    return max(values) if values else None


def _gpus(machine: JobMachine, key: Literal["load_start", "load_end"]) -> list[GpuLoad]:
    load = machine.get(key)
    return (load.get("gpus") if load else None) or []


def _gpu_reasons(run: JobMachine, base: JobMachine) -> list[str]:
    reasons: list[str] = []
    for name, machine in (("this run", run), ("the base run", base)):
        for key in ("load_start", "load_end"):
            if any(g.get("other_processes") for g in _gpus(machine, key)):
                reasons.append(f"other processes on the GPU of {name}")
                break
    clocks = [[g.get("sm_clock_mhz") for g in _gpus(m, "load_start")] for m in (run, base)]
    if all(clocks) and clocks[0][0] and clocks[1][0]:
        ratio = clocks[0][0] / clocks[1][0]
        if not 1 / (1 + CALIBRATION_TOLERANCE) <= ratio <= 1 + CALIBRATION_TOLERANCE:
            reasons.append(f"SM clock {clocks[0][0]} vs {clocks[1][0]} MHz")
    return reasons


def _calibration_reasons(cals: list[tuple[Calibration, Calibration]]) -> list[str]:
    """Why this run's and the base run's calibrations (each before and after) disagree."""
    low, high = 1 / (1 + CALIBRATION_TOLERANCE), 1 + CALIBRATION_TOLERANCE
    reasons = []
    for rate in _CALIBRATION_RATES:
        if (
            rate == "matmul_gflop_per_s"
            and len({c.get("matmul_dtype") for c in cals[0] + cals[1]}) > 1
        ):
            continue  # matmuls at another precision: only the copy compares
        values = [[c[rate] for c in pair] for pair in cals]
        what = rate.split("_", 1)[0]
        for name, (before, after) in zip(("this run", "the base run"), values, strict=True):
            if not low <= after / before <= high:
                reasons.append(f"{what} calibration changed {after / before:.2f}x during {name}")
        ratio = (sum(values[0]) / 2) / (sum(values[1]) / 2)
        if not low <= ratio <= high:
            reasons.append(f"{what} calibration {ratio:.2f}x")
    return reasons


def _ranks_per_node(record: dict[str, Any]) -> int:
    trainer = (record.get("config") or {}).get("trainer") or {}
    return trainer.get("devices") or record.get("devices") or 1


def _threads_reason(run: dict[str, Any], base: dict[str, Any]) -> str | None:
    """Runs with as many ranks per node must compute with the same threads per rank (float
    sums, and speed, follow the count). A scaling ratio (other ranks per node) compares when
    either the threads per rank (more ranks, more cores) or the threads on a node (ranks x
    threads per rank: the same cores, as the default gives) are the same."""
    mine, theirs = [(r.get("machine") or {}).get("threads_per_rank") for r in (run, base)]
    if mine == theirs:
        return None
    ranks = [_ranks_per_node(r) for r in (run, base)]
    if ranks[0] == ranks[1] or mine is None or theirs is None:
        return f"other threads per rank ({mine} vs {theirs})"
    on_node = (mine * ranks[0], theirs * ranks[1])
    if on_node[0] == on_node[1]:
        return None
    return f"other threads per rank ({mine} vs {theirs}; per node {on_node[0]} vs {on_node[1]})"


def verdict(run: dict[str, Any], base: dict[str, Any]) -> str | None:
    """Whether ``run``'s time divided by (or into) ``base``'s is a result.

    Args:
        run: The job record of the run the ratio is for.
        base: The job record it is compared to (the eager run, the fewest-device run).

    Returns:
        ``None`` when it is; ``"drift: <where>"`` when it is, but a run's step time moved
        within it (:func:`drift_note`); ``"unverified: no machine record"`` when either
        record predates machine records; else ``"confounded: <reasons>"``
        (``other GPU (A100 vs H100)``,
        ``calibration 0.55x``, ``load 2.1 vs 0.3 cores``, ``busy machine ...``,
        ``others used 1.9 cores during steps 400-1300 of the base run``).
    """
    machines: list[JobMachine] = [r.get("machine") or JobMachine() for r in (run, base)]
    cals = [(m.get("calibration_before"), m.get("calibration_after")) for m in machines]
    both = [(before, after) for before, after in cals if before and after]
    if len(both) < len(cals):
        return "unverified: no machine record"
    mine, theirs = machines
    reasons = [
        f"other {_NAMES[k]} ({mine.get(k)} vs {theirs.get(k)})"
        for k in FINGERPRINT_KEYS
        if k != "threads_per_rank" and mine.get(k) != theirs.get(k)
    ]
    if (threads := _threads_reason(run, base)) is not None:
        reasons.append(threads)
    other_hardware = bool(reasons)  # whose calibrations differ anyway
    loads = [_other_cores(m) for m in machines]
    if None not in loads:  # the load first: the likeliest cause on a shared machine
        if abs(loads[0] - loads[1]) > LOAD_TOLERANCE_CORES:
            reasons.append(f"load {loads[0]:.1f} vs {loads[1]:.1f} cores")
        for name, load, machine in zip(("this run", "the base run"), loads, machines, strict=True):
            cores = machine.get("affinity_cores") or machine.get("cpu_count") or 1
            if load >= cores:
                reasons.append(f"busy machine in {name} (others used {load:.1f} of {cores} cores)")
    for name, record in (("this run", run), ("the base run", base)):  # through the runs
        reasons += run_reasons(record.get("telemetry") or {}, name)
    reasons += _gpu_reasons(mine, theirs)
    if not other_hardware:
        calibration = _calibration_reasons(both)
        reasons += sorted(calibration, key=lambda r: "changed" in r)  # across runs first
    if len(reasons) > 3:  # a table cell: the first three, the CSV's verdict column alike
        reasons = [*reasons[:3], f"+{len(reasons) - 3} more"]
    return f"confounded: {'; '.join(reasons)}" if reasons else drift_note(run, base)


def impossible(column: str, value: float | None) -> str | None:
    """Why ``value`` of ``column`` cannot be true on one machine (``None`` when it can)."""
    if column == "scaling_efficiency" and value is not None and value > IMPOSSIBLE_EFFICIENCY:
        return f"efficiency {value:.2f} > {IMPOSSIBLE_EFFICIENCY} cannot be true"
    return None
