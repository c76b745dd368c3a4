"""Memory you can see: every fit's telemetry holds this rank's parameter, gradient and
optimizer-state bytes (its local shards under FSDP: about half of DDP's on 2 ranks) and the
fit's own peak memory, counted from the fit's start (not a peak an earlier job of the same
process left behind)."""

from __future__ import annotations

import pytest
import torch
from toy import ToyBlocksModule

from kiln.core import TrainerConfig, fit, launch
from kiln.core.telemetry.memory import device_peak_memory_mb

MODULE_KW = dict(n=16, batch_size=2, optimizer="adamw")
FIGURES = ("param_bytes", "grad_bytes", "optimizer_state_bytes")


def trainer(**kw) -> TrainerConfig:
    return TrainerConfig(accelerator="cpu", max_steps=2, progress=False, **kw)


def test_one_process_reports_its_state_bytes_exactly():
    module = ToyBlocksModule(**MODULE_KW)
    telemetry = fit(module, trainer()).telemetry
    params = sum(p.numel() for p in module.parameters())
    assert telemetry["param_bytes"] == 4 * params  # fp32
    assert telemetry["grad_bytes"] == 4 * params
    # AdamW: exp_avg and exp_avg_sq per parameter, plus a float32 step count per tensor
    tensors = len(list(module.parameters()))
    assert telemetry["optimizer_state_bytes"] == 2 * 4 * params + 4 * tensors


def state_of_both(devices: int) -> dict:
    """DDP's and FSDP's telemetry on this rank (top-level: spawned ranks import it)."""
    out = {}
    for strategy in ("ddp", "fsdp"):
        result = fit(ToyBlocksModule(**MODULE_KW), trainer(devices=devices, strategy=strategy))
        out[strategy] = {k: result.telemetry[k] for k in (*FIGURES, "peak_memory_mb")}
    return out


@pytest.mark.long  # a 2-rank launch; test_fsdp.py proves the halving in its one launch
def test_fsdp_on_two_ranks_holds_about_half_of_ddps_state_per_rank():
    ranks = launch(state_of_both, 2, 2)
    for name in FIGURES:
        ddp = [rank["ddp"][name] for rank in ranks]
        fsdp = [rank["fsdp"][name] for rank in ranks]
        assert ddp[0] == ddp[1]  # every rank holds the whole model
        # dim-0 chunks: an odd dimension makes rank 0's shard a row longer, plus padding
        assert all(0.45 * ddp[0] < f < 0.6 * ddp[0] for f in fsdp), (name, ddp, fsdp)
        assert sum(fsdp) >= ddp[0]
    assert all(rank[s]["peak_memory_mb"] > 0 for rank in ranks for s in ("ddp", "fsdp"))


def test_the_peak_is_the_fits_own():
    big = torch.ones(2**28 // 4 * 3)  # 768 MiB, touched: the process peak is now above it
    big_peak = device_peak_memory_mb(torch.device("cpu"))
    del big
    telemetry = fit(ToyBlocksModule(**MODULE_KW), trainer()).telemetry
    if telemetry["start_memory_mb"] is None:
        pytest.skip("needs Linux's /proc/self (VmHWM) for the fit's own CPU peak")
    assert telemetry["start_memory_mb"] <= telemetry["peak_memory_mb"]
    assert telemetry["peak_memory_mb"] < big_peak - 512
