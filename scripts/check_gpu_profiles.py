"""Check what only CUDA gives a profiled kiln-train sweep (``scripts/gpu_check.sh``'s profile
part): per job, kernels per step and the kernels' time by category, a memory snapshot that
PyTorch's memory viewer can read (allocator segments and a trace of its events), and the
machine series' SM clock and throttle reasons.

    python scripts/check_gpu_profiles.py <sweep dir> [--jobs 2]

Prints one line per job and each problem; exits 1 when a problem was found.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
from pathlib import Path
from typing import Any


def snapshot_problem(path: str | None) -> str | None:
    """Why the memory snapshot at ``path`` is not one the memory viewer shows (or ``None``)."""
    if not path:
        return "no memory snapshot"
    file = Path(path)
    if not file.is_file() or file.stat().st_size == 0:
        return f"memory snapshot {file} is missing or empty"
    with file.open("rb") as f:
        snapshot = pickle.load(f)  # written by torch.cuda.memory._dump_snapshot
    if not isinstance(snapshot, dict) or not snapshot.get("segments"):
        return f"memory snapshot {file} holds no allocator segments"
    if not any(snapshot.get("device_traces") or []):
        return f"memory snapshot {file} holds no allocation events"
    return None


def job_problems(record: dict[str, Any]) -> list[str]:
    """What a profiled CUDA job's ``summary.json`` lacks of the CUDA-only figures."""
    problems: list[str] = []
    profile = record.get("profile") or {}
    breakdown = profile.get("breakdown") or {}
    if not breakdown:
        problems.append("no profile breakdown")
    if not breakdown.get("kernels_per_step"):
        problems.append("no kernels per step")
    if not sum((breakdown.get("device_ms") or {}).values()):
        problems.append("no kernel time by category (device_ms)")
    problem = snapshot_problem(profile.get("memory_snapshot"))
    if problem:
        problems.append(problem)
    series = (record.get("telemetry") or {}).get("machine_series") or {}
    samples = series.get("samples") or {}
    clocks = [c for c in samples.get("sm_clock_mhz") or [] if c]
    if not clocks:
        problems.append("no SM clock in the machine series")
    if "throttle_reasons" not in samples:
        problems.append("no throttle reasons in the machine series")
    return problems


def check(sweep: Path, jobs: int) -> tuple[list[str], list[str]]:
    """One line per job of ``sweep`` and every problem found (``jobs``: how many it must hold)."""
    lines: list[str] = []
    problems: list[str] = []
    summaries = sorted(sweep.glob("*/summary.json"))
    if len(summaries) != jobs:
        problems.append(f"{len(summaries)} job summaries in {sweep}, expected {jobs}")
    for path in summaries:
        record = json.loads(path.read_text())
        breakdown = (record.get("profile") or {}).get("breakdown") or {}
        samples = ((record.get("telemetry") or {}).get("machine_series") or {}).get("samples")
        clocks = [c for c in (samples or {}).get("sm_clock_mhz") or [] if c]
        lines.append(
            f"{path.parent.name}: compile={record.get('compile_mode')} "
            f"step {breakdown.get('step_ms', 0):.2f} ms, "
            f"{breakdown.get('kernels_per_step', 0):.0f} kernels/step, "
            f"{sum((breakdown.get('device_ms') or {}).values()):.2f} kernel ms/step, "
            f"SM clock {min(clocks, default=0):.0f}-{max(clocks, default=0):.0f} MHz "
            f"({len(clocks)} samples)"
        )
        problems += [f"{path.parent.name}: {p}" for p in job_problems(record)]
    return lines, problems


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("sweep", type=Path)
    parser.add_argument("--jobs", type=int, default=2, help="job summaries the sweep must hold")
    args = parser.parse_args()
    lines, problems = check(args.sweep, args.jobs)
    for line in lines:
        print(f"profile: {line}")
    for problem in problems:
        print(f"profile: PROBLEM {problem}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
