"""The CUDA-only paths of kiln.core.fit: fp16 AMP with its GradScaler, CUDA graphs
(reduce-overhead), bf16 autocast, CUDA-event step timing, the device's peak memory, the
machine sampler's NVML readings and the measured matmul peak.

Marked ``gpu``: deselected by ``make test``, skipped without a CUDA device, and run on a GPU
machine by ``scripts/gpu_check.sh``.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from toy import ToyTokenModule, weights
from trainers import trainer_config

from kiln.core import CompileConfig, fit

pytestmark = pytest.mark.gpu


_trainer = partial(trainer_config, accelerator="cuda")


def _eager_reference(steps: int, accumulate: int = 1) -> dict[str, torch.Tensor]:
    module = ToyTokenModule(n=32, batch_size=4)
    fit(
        module,
        _trainer(max_steps=steps, precision="32-true", accumulate_grad_batches=accumulate),
    )
    return {k: v.float().cpu() for k, v in weights(module).items()}


def test_fp16_amp_trains_with_a_grad_scaler_and_tracks_eager():
    module = ToyTokenModule(n=32, batch_size=4)
    result = fit(module, _trainer(max_steps=6, precision="16-mixed"))
    assert result.global_step == 6
    assert all(torch.isfinite(torch.tensor(r["train/loss"])) for r in result.history)
    # fp16 AMP keeps fp32 master weights: close to the fp32 run, not equal to it.
    want = _eager_reference(6)
    for key, value in weights(module).items():
        assert value.dtype == torch.float32
        torch.testing.assert_close(value.cpu(), want[key], rtol=1e-2, atol=1e-2)


def test_bf16_autocast_runs_the_step_in_bf16():
    seen: list[torch.dtype] = []

    class Probe(ToyTokenModule):
        def forward(self, input_ids):
            out = super().forward(input_ids)
            if not out.is_meta:  # the first step's FLOP count runs a meta forward, no kernels
                seen.append(out.dtype)
            return out

    fit(Probe(n=16, batch_size=4), _trainer(max_steps=2, precision="bf16-mixed"))
    assert seen and set(seen) == {torch.bfloat16}


@pytest.mark.parametrize("accumulate", [1, 2])
def test_reduce_overhead_cuda_graphs_match_eager_and_report_their_compile(accumulate):
    """Each replay overwrites the graph's outputs: a micro-batch's loss and count, and a
    validation batch's outputs, must be read before the next one runs (accumulation and
    the validation at the end cross that boundary)."""
    module = ToyTokenModule(n=32, batch_size=4)
    result = fit(
        module,
        _trainer(max_steps=6, accumulate_grad_batches=accumulate),
        CompileConfig(mode="reduce-overhead"),
    )
    assert result.telemetry["compile_time_s"] > 0
    # training never recompiles; the validation at the end does (no grad, a last short batch)
    reasons = result.telemetry["recompile_reasons"]
    assert not [r for r in reasons if "grad_mode" not in r and "size mismatch" not in r], reasons
    losses = [row["train/loss"] for row in result.history if "train/loss" in row]
    eager = fit(
        ToyTokenModule(n=32, batch_size=4),
        _trainer(max_steps=6, accumulate_grad_batches=accumulate),
    )
    want_losses = [row["train/loss"] for row in eager.history if "train/loss" in row]
    torch.testing.assert_close(losses, want_losses, rtol=1e-4, atol=1e-5)
    want = _eager_reference(6, accumulate)
    for key, value in weights(module).items():
        torch.testing.assert_close(value.float().cpu(), want[key], rtol=1e-4, atol=1e-5)


def test_cuda_step_timing_and_peak_memory_are_measured():
    result = fit(ToyTokenModule(n=64, batch_size=4), _trainer(max_steps=8, warmup_steps=2))
    telemetry = result.telemetry
    assert telemetry["step_time_median_s"] > 0
    assert telemetry["peak_memory_mb"] > 0
    assert telemetry["samples_per_s"] > 0


def test_the_machine_series_holds_the_sm_clock_on_cuda(tmp_path):
    """On CUDA the sampler reads the job's device through NVML: its SM clock in every
    sample, its clock event reasons, and others' GPU memory, logged beside the loss; and the
    peak is a large matmul."""
    from lightning.fabric.loggers import CSVLogger

    logger = CSVLogger(root_dir=tmp_path, name="csv", version="")
    result = fit(
        ToyTokenModule(n=64, batch_size=4),
        _trainer(max_steps=40, machine_sample_s=0.01),
        loggers=[logger],
    )
    samples = result.telemetry["machine_series"]["samples"]
    assert samples["sm_clock_mhz"] and all(c > 0 for c in samples["sm_clock_mhz"]), samples
    assert "throttle_reasons" in samples and "other_gpu_memory_mb" in samples
    assert "machine/sm_clock_mhz" in (tmp_path / "csv" / "metrics.csv").read_text()
    from kiln.core.telemetry.machine import measured_peak

    peak = measured_peak("cuda", "bf16-mixed", budget_s=0.05)
    assert peak["matmul_peak_size"] >= 2048 and peak["matmul_peak_gflop_per_s"] > 1000, peak
