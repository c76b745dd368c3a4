"""One line per kiln-train job under a folder, with what a GPU check reads off its record:
step time, achieved TFLOP/s against the measured matmul peak and the spec peak (MFU), the
measured peaks themselves, recompiles, kernels per step, the SM clock's range over the run,
real tokens/s and the padding fraction.

    python scripts/gpu_table.py <folder>     # scripts/gpu_check.sh quick prints it at its end
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from kiln.experiments.jobs.mfu import mfu_fields, mfu_text
from kiln.experiments.jobs.train_record import TrainRecord

COLUMNS = (
    ("job", 30),
    ("status", 6),
    ("step ms", 8),
    ("TFLOP/s", 8),
    ("of peak", 8),
    ("MFU", 13),
    ("peak TF", 8),
    ("copy GB/s", 9),
    ("recomp", 6),
    ("kern/step", 9),
    ("SM MHz", 10),
    ("tok/s", 8),
    ("pad", 6),
)


def _num(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, int | float) else "-"


def row(path: Path, root: Path) -> list[str]:
    """The cells of the job whose ``summary.json`` is ``path``."""
    data = json.loads(path.read_text())
    record = TrainRecord.from_json(data)
    fields = mfu_fields(record)
    tel, machine = data.get("telemetry") or {}, data.get("machine") or {}
    breakdown = (data.get("profile") or {}).get("breakdown") or {}
    samples = (tel.get("machine_series") or {}).get("samples") or {}
    clocks = [c for c in samples.get("sm_clock_mhz") or [] if c]
    peak = (machine.get("matmul_peak") or {}).get("matmul_peak_gflop_per_s")
    return [
        str(path.parent.relative_to(root)) or ".",
        str(data.get("status")),
        _num((tel.get("step_time_median_s") or 0) * 1e3, ".2f"),
        _num(fields["achieved_tflops_per_s"], ".3g"),
        _num(fields["of_measured_peak"], ".3g"),
        mfu_text(fields),
        _num(peak / 1e3 if isinstance(peak, int | float) else None, ".1f"),
        _num((machine.get("copy_peak") or {}).get("copy_peak_gb_per_s"), ".0f"),
        _num(tel.get("recompiles"), "d"),
        _num(breakdown.get("kernels_per_step"), ".0f"),
        f"{min(clocks):.0f}-{max(clocks):.0f}" if clocks else "-",
        _num(tel.get("tokens_per_s"), ".0f"),
        _num(tel.get("padding_fraction"), ".3f"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    root = parser.parse_args().folder
    print(" ".join(f"{name:>{width}}" for name, width in COLUMNS))
    for path in sorted(root.glob("**/summary.json")):
        cells = row(path, root)
        print(" ".join(f"{cell:>{width}}" for cell, (_, width) in zip(cells, COLUMNS, strict=True)))


if __name__ == "__main__":
    main()
