"""FLOPs per optimizer step, achieved FLOP/s and MFU (model FLOPs utilization).

The FLOPs of a micro-batch are counted once, with torch's ``FlopCounterMode``, by running
``training_step`` and ``backward`` on meta-device stand-ins of the parameters, buffers and
batch: nothing is computed, no weight or gradient changes, no random stream moves. A step
costs that times the micro-batches of a full window (shapes are static, see DESIGN.md).
MFU divides the achieved FLOP/s by the device's dense peak for the run's compute dtype,
from the table below; kiln knows no peak for CPUs or unlisted GPUs, and reports ``None``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

import torch

# lightning re-exports lightning_utilities' function, whose `function` is a bare Callable
from lightning.fabric.utilities.apply_func import (
    apply_to_collection,  # pyright: ignore[reportPrivateImportUsage, reportUnknownVariableType]
)
from torch.utils.flop_counter import FlopCounterMode

from kiln.core.module_contract import as_dict
from kiln.core.telemetry.records import FlopFigures

log = logging.getLogger(__name__)


def _peaks(fp32: float, tf32: float, half: float, fp64: float | None = None) -> dict[str, float]:
    peaks = {"fp32": fp32, "tf32": tf32, "bf16": half, "fp16": half}
    return peaks if fp64 is None else {**peaks, "fp64": fp64}


# Dense (no sparsity) peak FLOP/s from the vendors' datasheets; fp64 with tensor cores.
# Keys: a lower-case part of torch.cuda.get_device_name(); the first match wins, so more
# specific names come first.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "h200": _peaks(67e12, 494.7e12, 989.4e12, fp64=67e12),
    "h100 pcie": _peaks(51.2e12, 378e12, 756e12, fp64=51.2e12),
    "h100": _peaks(66.9e12, 494.7e12, 989.4e12, fp64=66.9e12),
    "a100": _peaks(19.5e12, 156e12, 312e12, fp64=19.5e12),
    "a10g": _peaks(31.2e12, 62.5e12, 125e12),
    "l40": _peaks(90.5e12, 90.5e12, 181e12),
    "l4": _peaks(30.3e12, 60e12, 121e12),
    "4090": _peaks(82.6e12, 82.6e12, 165.2e12),
    # Volta has neither TF32 nor bf16: float32 matmuls run in float32
    "v100": {"fp64": 7.8e12, "fp32": 15.7e12, "tf32": 15.7e12, "fp16": 125e12},
}

_MAX_REASON_CHARS = 160
_COMPUTE_DTYPE = {"64": "fp64", "32": "fp32", "bf16": "bf16", "16": "fp16"}


def compute_dtype(precision: str) -> str:
    """The dtype matmuls run in under a Fabric precision string (``bf16-mixed`` -> ``bf16``).

    ``32-true`` counts as ``tf32`` when torch may use TF32 for float32 matmuls.
    """
    kind = _COMPUTE_DTYPE.get(precision.split("-")[0], "fp32")
    if kind == "fp32" and torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    return kind


def peak_flops_per_s(device: torch.device, precision: str) -> float | None:
    """The device's dense peak FLOP/s for ``precision``, or ``None`` where kiln knows none."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).lower()
    table = next((peaks for key, peaks in PEAK_FLOPS.items() if key in name), None)
    if table is None:
        return None
    return table.get(compute_dtype(precision))


def count_micro_batch_flops(module: torch.nn.Module, batch: Any) -> int | None:
    """FLOPs of one ``training_step`` forward and its backward on ``batch``, counted on meta.

    Returns ``None`` when the step cannot run on meta tensors, e.g. because it reads a
    tensor's value (``.item()``, data-dependent control flow, an ``assert`` on values); one
    log line says why and how to skip counting (module attribute ``count_flops = False``
    or ``trainer.count_flops=False``). A meta-device limitation is logged at INFO (the run
    is fine; only the figure is missing), any other failure at WARNING.
    """
    params = {
        name: torch.empty_like(p, device="meta").requires_grad_(p.requires_grad)
        for name, p in module.named_parameters()
    }
    buffers = {name: torch.empty_like(b, device="meta") for name, b in module.named_buffers()}
    hook = getattr(module, "flops_batch", None)  # the contract's optional hook
    batch = hook(batch) if callable(hook) else batch
    # Fabric converts a step's floating inputs to the weights' dtype (float64 under 64-true)
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), None)
    meta_batch = apply_to_collection(batch, torch.Tensor, _to_meta, dtype)
    counter = FlopCounterMode(display=False)
    stand_ins = {f"module.{name}": t for name, t in {**params, **buffers}.items()}
    try:
        # force_eager: blocks compiled in place (regional compile) must not trace meta inputs
        with (
            torch.random.fork_rng(devices=[]),  # pyright: ignore[reportUnknownMemberType]
            torch.compiler.set_stance("force_eager"),
            counter,
        ):
            torch.func.functional_call(_StepAndBackward(module), stand_ins, (meta_batch,))
    except Exception as error:  # any failure only costs the figure, never the run
        _log_not_counted(module, error)
        return None
    return int(counter.get_total_flops())


class _StepAndBackward(torch.nn.Module):
    """``training_step`` and its backward as one ``forward``: what ``functional_call`` runs
    with the meta stand-ins in place of the module's own parameters and buffers."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, batch: Any) -> None:
        # a LightningModule's (the contract's), which nn.Module's __getattr__ cannot type
        training_step = cast(Callable[..., Any], self.module.training_step)
        out = training_step(batch, 0)
        step_out = as_dict(out)
        loss = out if step_out is None else step_out["loss"]
        if loss.requires_grad:
            loss.backward()


def _to_meta(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """``tensor`` on meta; a floating one in ``dtype`` (the weights'), where given."""
    floating = dtype is not None and tensor.is_floating_point()
    return tensor.to("meta", dtype=dtype) if floating else tensor.to("meta")


def _log_not_counted(module: torch.nn.Module, error: Exception) -> None:
    """One line: why the FLOPs were not counted and how to skip counting."""
    text = str(error).strip().splitlines()
    reason = type(error).__name__ + (f": {text[0][:_MAX_REASON_CHARS]}" if text else "")
    on_meta = "meta" in str(error).lower() or isinstance(error, NotImplementedError)
    log.log(
        logging.INFO if on_meta else logging.WARNING,
        "FLOPs not counted: %s.training_step cannot run on meta tensors (%s); flops_per_step "
        "and mfu are not reported (count_flops = False on the module skips counting)",
        type(module).__name__,
        reason,
    )


def flops_telemetry(
    micro_batch_flops: int | None,
    micro_batches: int,
    world_size: int,
    step_time_s: float | None,
    peak: float | None,
) -> FlopFigures:
    """``flops_per_step`` (all ranks), ``achieved_flops_per_s`` and ``mfu`` of a run.

    Args:
        micro_batch_flops: FLOPs of one micro-batch's forward and backward, or ``None``.
        micro_batches: Micro-batches per full window (``accumulate_grad_batches``).
        world_size: Ranks; each trains its own micro-batches.
        step_time_s: The median optimizer-step time, or ``None`` before any step.
        peak: One device's peak FLOP/s, or ``None`` where unknown.
    """
    if micro_batch_flops is None:
        return {"flops_per_step": None, "achieved_flops_per_s": None, "mfu": None}
    per_step = micro_batch_flops * micro_batches * world_size
    achieved = per_step / step_time_s if step_time_s else None
    mfu = achieved / (peak * world_size) if achieved is not None and peak else None
    return {"flops_per_step": per_step, "achieved_flops_per_s": achieved, "mfu": mfu}
