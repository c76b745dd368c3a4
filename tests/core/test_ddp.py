"""Two gloo processes with b samples each must train as one batch holding both ranks' items,
also with token-weighted accumulation (the ranks hold different token counts): exactly, in
float64, against a plain PyTorch big-batch AdamW reference."""

from __future__ import annotations

import signal

import pytest
import torch
from toy import ToyTokenModule, reference_run, weights

from kiln.core import TrainerConfig, fit, launch

MODULE_KW = dict(n=40, lr=0.01, optimizer="adamw")


def train(devices: int, batch_size: int, accumulate: int) -> dict:
    """Top-level so spawned workers can import it; returns weights and logged history."""
    module = ToyTokenModule(batch_size=batch_size, **MODULE_KW)
    cfg = TrainerConfig(
        accelerator="cpu",
        devices=devices,
        precision="64-true",
        max_steps=5,
        accumulate_grad_batches=accumulate,
        log_every_n_steps=1,
        progress=False,
    )
    result = fit(module, cfg)
    return {"weights": weights(module), "history": result.history, "metrics": result.metrics}


@pytest.mark.parametrize("accumulate", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_two_processes_match_one_big_batch_exactly_in_float64(accumulate: int) -> None:
    b = 2
    # the distributed sampler deals samples round-robin: a window over both ranks holds
    # the next 2 * b * accumulate samples in dataset order
    want, losses = reference_run(ToyTokenModule(**MODULE_KW), [2 * b * accumulate] * 5)
    single = train(1, 2 * b, accumulate)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    ranks = launch(train, 2, 2, b, accumulate)
    assert len(ranks) == 2
    # torch's elastic agent installs its own handlers; launch puts this process's back
    assert {s: signal.getsignal(s) for s in handlers} == handlers
    for rank in ranks:
        for key, value in want.items():
            torch.testing.assert_close(rank["weights"][key], value, rtol=0.0, atol=1e-12)
        # the logged loss is the global window's token-weighted mean, identical on every rank
        assert [row["step"] for row in rank["history"]] == [1, 2, 3, 4, 5]
        logged = [row["train/loss"] for row in rank["history"]]
        assert logged == pytest.approx(losses, rel=0.0, abs=1e-12)
        # validation is gathered over both ranks in order, without the sampler's duplicates
        assert rank["metrics"]["val/samples"] == 10
        assert rank["metrics"]["val/nll"] == pytest.approx(single["metrics"]["val/nll"], rel=1e-12)


def test_several_devices_without_launcher_fail_clearly() -> None:
    with pytest.raises(RuntimeError, match=r"kiln.core.launch"):
        fit(ToyTokenModule(), TrainerConfig(accelerator="cpu", devices=2, progress=False))
