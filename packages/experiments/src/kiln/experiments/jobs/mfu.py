"""MFU figures of a kiln-train record, as the job table and ``kiln-report`` show them.

kiln.core puts ``flops_per_step``, ``achieved_flops_per_s`` and ``mfu`` in the telemetry
(``trainer.count_flops``); ``mfu`` is ``None`` where kiln knows no peak (the CPU, an unlisted
GPU), which the tables say instead of a dash. ``of_measured_peak`` divides by the peak the job
measured on its own device, so it exists on the CPU too: kiln-train writes it into the
record's ``telemetry`` beside ``mfu`` and shows both in the job's table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

from kiln.experiments.jobs.train_record import TrainRecord


class MfuFields(TypedDict):
    """A record's FLOPs and MFU cells."""

    flops_per_step: int | float | None
    achieved_tflops_per_s: float | None
    mfu: float | None
    """A fraction of the devices' peak."""
    mfu_na: str | None
    """Why there is no MFU (``"cpu"``, ``"peak unknown"``, ``"flops not counted"``)."""
    of_measured_peak: float | None
    """Achieved over this machine's own measured matmul peak at the run's precision (on
    GPUs, per device times the devices); on any device where both are known."""
    of_measured_bandwidth: float | None
    """Where a step is bandwidth-bound (:func:`of_measured_bandwidth`): the bytes a step
    must move over its time, against this machine's own measured copy bandwidth."""


def _on_cpu(record: TrainRecord) -> bool:
    accelerator = ((record.config or {}).get("trainer") or {}).get("accelerator")
    if accelerator in ("cpu", "cuda", "gpu"):
        return accelerator == "cpu"
    return not (record.machine or {}).get("device_count")


def _of_measured_peak(record: TrainRecord, achieved: Any) -> float | None:
    peak = ((record.machine or {}).get("matmul_peak") or {}).get("matmul_peak_gflop_per_s")
    if not isinstance(achieved, int | float) or not isinstance(peak, int | float) or peak <= 0:
        return None
    # the CPU peak is the machine's (all its usable cores); a GPU's is one device's
    devices = 1 if _on_cpu(record) else max(record.devices, 1)
    return achieved / (peak * 1e9 * devices)


def step_bytes(record: TrainRecord) -> float | None:
    """The bytes an optimizer step must move at least: every parameter, gradient and
    optimizer state tensor read and written once by the update, on every device."""
    tel = record.telemetry or {}
    parts = [tel.get(k) for k in ("param_bytes", "grad_bytes", "optimizer_state_bytes")]
    if not all(isinstance(p, int | float) for p in parts):
        return None
    return 2.0 * sum(parts) * max(record.devices, 1)  # type: ignore[arg-type]


def of_measured_bandwidth(record: TrainRecord) -> float | None:
    """The step's memory traffic per second (:func:`step_bytes` over the median step time)
    over this machine's measured copy bandwidth (on GPUs, per device times the devices),
    given only where the step is bandwidth-bound: its FLOPs per byte moved lie below the
    machine's own ridge point, measured matmul peak / measured copy bandwidth (the roofline:
    below it no amount of compute reaches the matmul peak). ``None`` elsewhere."""
    tel = record.telemetry or {}
    machine = record.machine or {}
    flops, seconds = tel.get("flops_per_step"), tel.get("step_time_median_s")
    peak = (machine.get("matmul_peak") or {}).get("matmul_peak_gflop_per_s")
    copy = (machine.get("copy_peak") or {}).get("copy_peak_gb_per_s")
    moved = step_bytes(record)
    numbers = (flops, seconds, peak, copy, moved)
    if not all(isinstance(n, int | float) and n > 0 for n in numbers):
        return None
    if flops / moved >= peak / copy:  # type: ignore[operator]  # compute-bound
        return None
    devices = 1 if _on_cpu(record) else max(record.devices, 1)
    return moved / seconds / (copy * 1e9 * devices)  # type: ignore[operator]


def mfu_fields(record: TrainRecord) -> MfuFields:
    """The record's :class:`MfuFields` (numbers an older file holds as anything else are
    ``None``)."""
    tel = record.telemetry or {}  # a file may hold null
    flops, achieved, mfu = (
        tel.get("flops_per_step"),
        tel.get("achieved_flops_per_s"),
        tel.get("mfu"),
    )
    na = None
    if not isinstance(mfu, int | float):
        mfu = None
        if not isinstance(flops, int | float):
            na = "flops not counted"
        else:
            na = "cpu" if _on_cpu(record) else "peak unknown"
    return {
        "of_measured_peak": _of_measured_peak(record, achieved),
        "of_measured_bandwidth": of_measured_bandwidth(record),
        "flops_per_step": flops if isinstance(flops, int | float) else None,
        "achieved_tflops_per_s": achieved / 1e12 if isinstance(achieved, int | float) else None,
        "mfu": mfu,
        "mfu_na": na,
    }


def measured_peak_text(record: TrainRecord, fraction: float) -> str:
    """The "of measured peak" cell: ``"1.7% of 167 GFLOP/s"`` (the peak this job measured
    on its device at its precision, per device)."""
    peak = ((record.machine or {}).get("matmul_peak") or {}).get("matmul_peak_gflop_per_s")
    return (
        f"{fraction:.1%} of {peak:.4g} GFLOP/s"
        if isinstance(peak, int | float)
        else f"{fraction:.1%}"
    )


def mfu_text(fields: Mapping[str, Any]) -> str:
    """The MFU cell: ``"41.2%"`` or ``"n/a (cpu)"``."""
    if fields["mfu"] is not None:
        return f"{fields['mfu']:.1%}"
    return f"n/a ({fields['mfu_na']})"
