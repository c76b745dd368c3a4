"""The measurement behind ``kiln-bench``: eager against compiled training steps of one module.

Modelled on PyTorch's ``benchmarks/dynamo`` harness:

1. Dropout is switched off (probabilities set to 0) and the module deep-copied, so the
   eager and the compiled variant start from identical weights and compute the same thing.
   The compiled variant is ``torch.compile`` of a module whose ``forward`` is the
   contract's ``training_step`` (what kiln-train compiles: Fabric routes ``training_step``
   through the compiled ``forward``); with ``compile.mode=none`` it stays eager (the control).
2. Precision comes from Lightning Fabric's precision plugins, the classes ``Fabric`` uses in
   kiln-train: autocast around the step, ``convert_module``/``convert_input`` for the
   ``*-true`` precisions, and a ``GradScaler`` per variant for ``16-mixed``.
3. A step is zero-grad, ``training_step`` (loss), backward, optimizer step, synchronized
   on CUDA. The first step of each variant runs on the same batch and weights: loss and
   gradients are compared (accuracy), and the compiled one's wall time is the compile time.
4. Both variants warm up, then run interleaved ``repeats`` times, the order flipping every
   pair (A B, B A, A B, ...) to cancel position effects; speedup is
   median eager / median compiled, the spread the 25th/75th percentile of per-pair ratios.
5. Peak memory of each variant (see :mod:`kiln.experiments.bench.step_memory`); graph breaks,
   recompiles and torch's own compile seconds from kiln.core's ``CompileWatch``.

Nothing raises out of :func:`run_benchmark`: it runs in named stages
(:func:`kiln.experiments.jobs.stages.stage`), and an exception becomes a result with status
``error`` and the stage it happened in, so one bad model never stops a sweep.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import torch
from lightning.fabric.plugins import DoublePrecision, HalfPrecision, MixedPrecision, Precision
from lightning.fabric.utilities import move_data_to_device
from torch import nn

from kiln.core import PRECISIONS, CompileConfig, unpack_optimizers
from kiln.core.telemetry.compile_watch import CompileWatch
from kiln.experiments.bench.record import BenchResult
from kiln.experiments.bench.stats import speedup_stats
from kiln.experiments.bench.step_memory import variant_peak_memory_mb
from kiln.experiments.jobs.stages import stage, stage_of

METHOD = (
    "interleaved eager/compiled train steps (order flipped every pair; zero_grad, "
    "training_step, backward, optimizer step), medians after warm-up; speedup = median "
    "eager / median compiled, spread = "
    "p25-p75 of per-pair ratios; compile time = first compiled step; dropout off"
)

TOLERANCES = {
    "64-true": 1e-7,
    "32-true": 1e-4,
    "16-mixed": 1e-2,
    "bf16-mixed": 2e-2,
    "16-true": 5e-2,
    "bf16-true": 5e-2,
}
"""Largest relative error of the loss and of the gradients (as one vector, L2 norm)
accepted between compiled and eager, by precision. PyTorch's harness uses about 1e-2 for
AMP training; bf16 keeps 8 mantissa bits, so bf16 gets twice that."""


CONTROL_BAND = (0.95, 1.05)
"""An eager-against-eager control reads 1.0 on a quiet machine: outside this band, or with an
interval that excludes 1.0, it says the machine was too noisy for the figures it ran with."""


def control_noise(result: Mapping[str, object]) -> str | None:
    """Why a control's ``result`` (``compile=none``) says the machine was noisy, or ``None``."""
    speedup, low, high = (result.get(k) for k in ("speedup", "speedup_ci_low", "speedup_ci_high"))
    if not isinstance(speedup, int | float):
        return None
    low_band, high_band = CONTROL_BAND
    if not low_band <= speedup <= high_band:
        return f"control {speedup:.3f} outside [{low_band}, {high_band}]"
    if isinstance(low, int | float) and isinstance(high, int | float) and not low <= 1.0 <= high:
        return f"control interval [{low:.3f}, {high:.3f}] excludes 1.0"
    return None


def resolve_device(accelerator: str) -> torch.device:
    """``auto`` (CUDA when available), ``cpu`` or ``cuda``/``cuda:N`` as a ``torch.device``."""
    if accelerator == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if accelerator == "cpu" or accelerator.startswith("cuda"):
        device = torch.device(accelerator)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"accelerator={accelerator!r} but CUDA is not available here")
        return device
    raise ValueError(f"accelerator={accelerator!r} is not valid; choose one of: auto, cpu, cuda")


def precision_plugin(precision: str, device: torch.device) -> Precision:
    """The Lightning Fabric precision plugin Fabric would use for ``precision`` on ``device``.

    Raises:
        ValueError: For an unknown precision, or ``16-mixed`` on the CPU (Fabric refuses it too).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not valid; choose one of: {PRECISIONS}")
    if precision in ("16-mixed", "bf16-mixed"):
        if precision == "16-mixed" and device.type != "cuda":
            raise ValueError(
                "precision=16-mixed (fp16 AMP with a GradScaler) needs a CUDA device; "
                "use bf16-mixed on the CPU"
            )
        return MixedPrecision(precision, device=device.type)  # type: ignore[arg-type]
    if precision in ("16-true", "bf16-true"):
        return HalfPrecision(precision)  # type: ignore[arg-type]
    if precision == "64-true":
        return DoublePrecision()
    return Precision()


def disable_dropout(module: nn.Module) -> nn.Module:
    """Set every dropout probability in ``module`` to 0, in place, keeping train mode.

    Covers ``nn.Dropout*`` modules and float attributes whose name mentions dropout or drop
    path (HF attention's ``attention_dropout``/``dropout_prob``, timm's ``DropPath.drop_prob``),
    so eager and compiled runs compute the same thing while batch norm still trains.
    """
    for sub in module.modules():
        if isinstance(sub, nn.modules.dropout._DropoutNd):
            sub.p = 0.0
        for name, value in list(vars(sub).items()):
            lowered = name.lower()
            if isinstance(value, float) and (
                "dropout" in lowered or "drop_prob" in lowered or "drop_path" in lowered
            ):
                setattr(sub, name, 0.0)
    return module


class TrainingStep(nn.Module):
    """A module whose ``forward`` is ``module.training_step(batch, 0)["loss"]`` (compiled)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, batch: Any) -> torch.Tensor:
        out = self.module.training_step(batch, 0)
        return out["loss"] if isinstance(out, dict) else out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Variant:
    """One side of the comparison: a step function, its module, optimizer and precision."""

    def __init__(
        self,
        module: nn.Module,
        compile_cfg: CompileConfig | None,
        precision: str,
        device: torch.device,
    ) -> None:
        self.plugin = precision_plugin(precision, device)
        self.module = self.plugin.convert_module(module).to(device)
        self.optimizer, _ = unpack_optimizers(
            self.module.configure_optimizers()
        )  # no scheduler steps
        step = TrainingStep(self.module)
        self.compiled = compile_cfg is not None and compile_cfg.enabled
        self.fn: Callable[[Any], torch.Tensor] = (
            torch.compile(step, **compile_cfg.torch_compile_kwargs()) if self.compiled else step
        )
        self.device = device

    def step(self, batch: Any, capture: dict | None = None) -> None:
        """One training step; with ``capture``, store the loss and gradients before the update."""
        if self.compiled and self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()  # a new iteration for CUDA graph trees
        self.optimizer.zero_grad(set_to_none=True)
        with self.plugin.forward_context():
            loss = self.fn(batch)
        self.plugin.backward(loss, None)
        if capture is not None:
            capture["loss"] = loss.detach().double().cpu()
            capture["grads"] = {
                n: None if p.grad is None else p.grad.detach().double().cpu()
                for n, p in self.module.named_parameters()
            }
            if getattr(self.plugin, "scaler", None) is not None:  # compare unscaled gradients
                scale = float(self.plugin.scaler.get_scale())
                capture["grads"] = {
                    n: None if g is None else g / scale for n, g in capture["grads"].items()
                }
        self.plugin.optimizer_step(self.optimizer)

    def timed_step(self, batch: Any, capture: dict | None = None) -> float:
        _sync(self.device)
        start = time.perf_counter()
        self.step(batch, capture)
        _sync(self.device)
        return time.perf_counter() - start


def compare(eager: dict, compiled: dict, tolerance: float) -> dict[str, Any]:
    """Relative error of the loss and of all gradients (one vector, L2) of compiled vs eager."""

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        denom = float(torch.linalg.vector_norm(b))
        return float(torch.linalg.vector_norm(a - b)) / max(denom, 1e-12)

    missing = [
        n for n, g in eager["grads"].items() if (g is None) != (compiled["grads"].get(n) is None)
    ]
    loss_err = rel(compiled["loss"].reshape(1), eager["loss"].reshape(1))
    pairs = [
        (compiled["grads"][n], g)
        for n, g in eager["grads"].items()
        if g is not None and compiled["grads"].get(n) is not None
    ]
    if pairs:
        diff = torch.cat([(c - e).flatten() for c, e in pairs])
        ref = torch.cat([e.flatten() for _, e in pairs])
        grad_err = float(torch.linalg.vector_norm(diff)) / max(
            float(torch.linalg.vector_norm(ref)), 1e-12
        )
    else:
        grad_err = float("nan")
    ok = (
        not missing
        and math.isfinite(loss_err)
        and math.isfinite(grad_err)
        and loss_err <= tolerance
        and grad_err <= tolerance
    )
    return {
        "loss_rel_err": loss_err,
        "grad_rel_err": grad_err,
        "tolerance": tolerance,
        "ok": ok,
        "missing_grads": missing[:10],
    }


def reset_dynamo() -> None:
    """Forget compiled code, so each benchmark (one of several in a process) starts cold."""
    torch.compiler.reset()


def run_benchmark(
    module: nn.Module,
    batch: Any,
    *,
    precision: str = "32-true",
    compile_cfg: CompileConfig | None = None,
    accelerator: str = "auto",
    warmup: int = 3,
    repeats: int = 20,
    memory_steps: int = 2,
    tolerance: float | None = None,
    seed: int = 0,
    cold_compile: bool = True,
    profile_steps: int = 0,
    profile_dir: str | Path | None = None,
) -> BenchResult:
    """Benchmark eager against compiled training steps of ``module`` on ``batch``.

    Args:
        module: A module following kiln's contract (``training_step``, ``configure_optimizers``).
            It is modified (dropout off, moved, converted) and used as the eager variant.
        batch: The fixed batch every step trains on.
        precision: A Fabric precision (``32-true``, ``bf16-mixed``, ``16-mixed``, ...).
        compile_cfg: How the compiled variant is compiled; ``None`` or mode ``none`` is the
            eager-against-eager control.
        accelerator: ``auto``, ``cpu`` or ``cuda``.
        warmup: Steps of each variant after the first (compiling) one, before timing.
        repeats: Timed eager/compiled pairs.
        memory_steps: Steps of each variant whose largest peak is the variant's peak memory.
        tolerance: Accepted relative error of loss and gradients; ``None`` picks
            :data:`TOLERANCES` by precision.
        seed: Seeds torch before each variant's first step.
        cold_compile: Bypass inductor's and AOT autograd's on-disk caches while compiling,
            so ``compile_time_s`` is what a first run on a fresh machine pays.
        profile_steps: After timing, profile this many steps of each variant into
            ``profile_dir`` (:mod:`kiln.experiments.bench.profile_phases`); 0: no profile.

    Returns:
        The measurement part of ``bench.json``: ``status`` (``pass``/``fail``/``error``),
        ``reason``, ``speedup`` and its spread, medians, ``compile_time_s``, memory, graph
        breaks, recompiles and ``accuracy``. An error's reason starts with its stage
        (``"first step (accuracy, compile): RuntimeError: ..."``).
    """
    if warmup < 0 or repeats < 1 or memory_steps < 0:
        raise ValueError(
            f"need warmup >= 0, repeats >= 1, memory_steps >= 0; got {warmup}, "
            f"{repeats}, {memory_steps}"
        )
    compile_cfg = compile_cfg or CompileConfig(mode="none")
    tol = TOLERANCES.get(precision, 1e-2) if tolerance is None else tolerance
    result: BenchResult = {
        "status": "error",
        "reason": None,
        "precision": precision,
        "compile_mode": compile_cfg.mode,
        "control": compile_cfg.mode == "none",
        "backend": compile_cfg.backend,
        "repeats": repeats,
        "warmup": warmup,
        "method": METHOD,
    }
    eager = compiled = None
    watch = CompileWatch(threshold=compile_cfg.recompile_warn_threshold)
    try:
        with stage("setup"):
            device = resolve_device(accelerator)
            result["device"] = str(device)
            reset_dynamo()
            watch.start()  # counts this benchmark's compiles, recompiles and graph breaks
            disable_dropout(module).train()
            if getattr(module, "total_steps", 0) is None:  # schedulers size themselves by it
                module.total_steps = 1 + warmup + repeats + 2 * memory_steps
            twin = copy.deepcopy(module)
            eager = _Variant(module, None, precision, device)
            compiled = _Variant(twin, compile_cfg, precision, device)
            batch = eager.plugin.convert_input(move_data_to_device(batch, device))
        with stage("first step (accuracy, compile)"):
            result.update(_first_steps(eager, compiled, batch, seed, cold_compile, tol))
        with stage("warm-up"):
            for _ in range(warmup):
                eager.step(batch)
                compiled.step(batch)
        with stage("timing"):
            result.update(_timed_pairs(eager, compiled, batch, repeats))
        result.update(_profiles(eager, compiled, batch, profile_steps, profile_dir))
        with stage("memory"):
            if memory_steps:
                result.update(_peak_memory(eager, compiled, batch, memory_steps))
            result.update(_compile_stats(watch))
        result.update(_verdict(result.get("accuracy") or {}))
        if result["control"]:  # nothing compiled: its first step is no compile time
            result["compile_time_s"] = result["dynamo_compile_time_s"] = None
            result["noisy_machine"] = control_noise(result)
    except Exception as exc:  # a failing model is a row of the table, never a crashed sweep
        result["status"] = "error"
        reason = f"{type(exc).__name__}: {str(exc).strip()[:500]}"
        result["reason"] = f"{stage_of(exc, 'setup')}: {reason}"
        result["traceback"] = traceback.format_exc(limit=8)
        with contextlib.suppress(Exception):  # stats are best effort after a failure
            result.update(_compile_stats(watch))
    finally:
        eager = compiled = None  # free both variants before the next job
        reset_dynamo()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return result


def _profiles(
    eager: _Variant, compiled: _Variant, batch: Any, steps: int, directory: str | Path | None
) -> BenchResult:
    """``steps`` profiled steps of each variant (nothing with ``steps`` 0)."""
    if not steps:
        return {}
    from kiln.experiments.bench.profile_phases import profile_variant

    root = Path(directory or ".")
    with stage("profile"):
        profiles = {
            name: profile_variant(
                lambda v=variant: v.step(batch), variant.device, steps, root / f"profile_{name}"
            )
            for name, variant in (("eager", eager), ("compiled", compiled))
        }
    return {"profile": profiles}


def _first_steps(
    eager: _Variant, compiled: _Variant, batch: Any, seed: int, cold: bool, tol: float
) -> BenchResult:
    """Each variant's first step from the same seed: accuracy, and the compile time."""
    first_eager: dict = {}
    first_compiled: dict = {}
    torch.manual_seed(seed)
    first_eager_s = eager.timed_step(batch, first_eager)
    torch.manual_seed(seed)
    with _compile_caches(cold):
        compile_time_s = compiled.timed_step(batch, first_compiled)
    return {
        "first_eager_step_s": first_eager_s,
        "compile_time_s": compile_time_s,
        "cold_compile": cold,
        "accuracy": compare(first_eager, first_compiled, tol),
    }


def _timed_pairs(eager: _Variant, compiled: _Variant, batch: Any, repeats: int) -> BenchResult:
    """``repeats`` interleaved eager/compiled steps, their times and speedup statistics."""
    eager_s, compiled_s = [], []
    for i in range(repeats):
        # Interleaved, so drift on a shared machine hits both alike; the order flips every
        # pair (A B, B A, ...) because the second step of a pair measured systematically
        # faster on a loaded 2-core machine (eager-vs-eager controls gave 1.1-1.3).
        if i % 2 == 0:
            eager_s.append(eager.timed_step(batch))
            compiled_s.append(compiled.timed_step(batch))
        else:
            compiled_s.append(compiled.timed_step(batch))
            eager_s.append(eager.timed_step(batch))
    return {
        **speedup_stats(eager_s, compiled_s),
        "eager_times_s": eager_s,
        "compiled_times_s": compiled_s,
    }


def _peak_memory(eager: _Variant, compiled: _Variant, batch: Any, steps: int) -> BenchResult:
    """Each variant's peak memory (:mod:`kiln.experiments.bench.step_memory`) and their ratio."""
    mem_e, mem_c = (
        variant_peak_memory_mb(lambda v=v: v.step(batch), v.module, v.optimizer, v.device, steps)
        for v in (eager, compiled)
    )
    ratio = mem_c / mem_e if mem_e and mem_c is not None else None
    return {"memory_eager_mb": mem_e, "memory_compiled_mb": mem_c, "memory_ratio": ratio}


def _verdict(accuracy: dict[str, Any]) -> BenchResult:
    """``pass`` when the accuracy check passed, else ``fail`` with the numbers that failed."""
    if accuracy["ok"]:
        return {"status": "pass"}
    why = (
        f"missing gradients {accuracy['missing_grads']}"
        if accuracy["missing_grads"]
        else (
            f"loss rel err {accuracy['loss_rel_err']:.2e}, "
            f"grad rel err {accuracy['grad_rel_err']:.2e} > tolerance {accuracy['tolerance']:.0e}"
        )
    )
    return {"status": "fail", "reason": f"accuracy: {why}"}


def _compile_caches(cold: bool) -> contextlib.AbstractContextManager:
    """Inductor's FX-graph and AOT autograd caches off when ``cold``.

    Graph-level caches only: generated kernels compiled earlier on this machine are still
    found on disk, and the first compile in a process also pays inductor's start-up.
    """
    if not cold:
        return contextlib.nullcontext()
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    stack = contextlib.ExitStack()
    stack.enter_context(inductor_config.patch(fx_graph_cache=False, autotune_local_cache=False))
    stack.enter_context(functorch_config.patch(enable_autograd_cache=False))
    return stack


def _compile_stats(watch: CompileWatch) -> BenchResult:
    """Graph breaks, recompiles and torch's own compile seconds (all frames, lazy backward)."""
    stats: dict[str, Any] = {**watch.snapshot()}
    stats["dynamo_compile_time_s"] = stats.pop("compile_time_s")
    return cast(BenchResult, stats)  # CompileFigures' keys, compile_time_s renamed
