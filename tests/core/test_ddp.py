"""Two gloo processes with b samples each must train as one process with 2b per batch,
also with token-weighted accumulation (the ranks hold different token counts)."""

from __future__ import annotations

import pytest
import torch
from toy import ToyTokenModule, float64_outputs, weights

from kiln.core import TrainerConfig, fit, launch


def train(devices: int, batch_size: int, accumulate: int) -> dict:
    """Top-level so spawned workers can import it; returns weights and logged history."""
    module = ToyTokenModule(n=24, batch_size=batch_size)
    cfg = TrainerConfig(
        accelerator="cpu",
        devices=devices,
        precision="64-true",
        max_steps=3,
        accumulate_grad_batches=accumulate,
        log_every_n_steps=1,
        progress=False,
    )
    with float64_outputs():
        result = fit(module, cfg)
    return {"weights": weights(module), "history": result.history, "metrics": result.metrics}


@pytest.mark.parametrize("accumulate", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_two_processes_match_one_with_the_same_global_batch(accumulate: int) -> None:
    single = train(1, 4, accumulate)
    ranks = launch(train, 2, 2, 2, accumulate)
    assert len(ranks) == 2
    for rank in ranks:
        for key, value in single["weights"].items():
            torch.testing.assert_close(rank["weights"][key], value, rtol=1e-10, atol=1e-12)
        # the logged loss is the global window mean, identical on every rank
        for a, b in zip(rank["history"], single["history"], strict=True):
            assert a["step"] == b["step"]
            assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-10)
        # validation is gathered over both ranks in order, without the sampler's duplicates
        assert rank["metrics"]["val/samples"] == 10
        assert rank["metrics"]["val/nll"] == pytest.approx(single["metrics"]["val/nll"], rel=1e-10)


def test_several_devices_without_launcher_fail_clearly() -> None:
    with pytest.raises(RuntimeError, match="kiln.core.launch"):
        fit(ToyTokenModule(), TrainerConfig(accelerator="cpu", devices=2, progress=False))
