"""MFU figures of a kiln-train record, as the job table and ``kiln-report`` show them.

kiln.core puts ``flops_per_step``, ``achieved_flops_per_s`` and ``mfu`` in the telemetry
(``trainer.count_flops``); ``mfu`` is ``None`` where kiln knows no peak (the CPU, an unlisted
GPU), which the tables say instead of a dash.
"""

from __future__ import annotations

from typing import Any

from kiln.experiments.jobs.train_record import TrainRecord


def _on_cpu(record: TrainRecord) -> bool:
    accelerator = ((record.config or {}).get("trainer") or {}).get("accelerator")
    if accelerator in ("cpu", "cuda", "gpu"):
        return accelerator == "cpu"
    return not (record.machine or {}).get("device_count")


def mfu_fields(record: TrainRecord) -> dict[str, Any]:
    """``flops_per_step``, ``achieved_tflops_per_s``, ``mfu`` (a fraction) and ``mfu_na``:
    why there is no MFU (``"cpu"``, ``"peak unknown"``, ``"flops not counted"``), else ``None``.
    """
    tel = record.telemetry or {}
    flops, achieved, mfu = (tel.get(k) for k in ("flops_per_step", "achieved_flops_per_s", "mfu"))
    na = None
    if not isinstance(mfu, int | float):
        mfu = None
        if not isinstance(flops, int | float):
            na = "flops not counted"
        else:
            na = "cpu" if _on_cpu(record) else "peak unknown"
    return {
        "flops_per_step": flops if isinstance(flops, int | float) else None,
        "achieved_tflops_per_s": achieved / 1e12 if isinstance(achieved, int | float) else None,
        "mfu": mfu,
        "mfu_na": na,
    }


def mfu_text(fields: dict[str, Any]) -> str:
    """The MFU cell: ``"41.2%"`` or ``"n/a (cpu)"``."""
    if fields["mfu"] is not None:
        return f"{fields['mfu']:.1%}"
    return f"n/a ({fields['mfu_na']})"
