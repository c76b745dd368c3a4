"""Gradient accumulation: k micro-batches of b must update the weights as one batch of k*b.

The reference is a plain PyTorch loop over one big batch per window (token-weighted:
sum of per-token losses / tokens in the window), with the partial last window of an
epoch normalised by its own token count.
"""

from __future__ import annotations

import pytest
import torch
from toy import ToyTokenModule, float64_outputs, weights

from kiln.core import TrainerConfig, fit


def reference_run(
    module: ToyTokenModule, window_samples: list[int], lr: float, clip: float | None = None
) -> dict:
    """Plain PyTorch: one optimizer step per window, on one batch holding the whole window."""
    module = module.double()
    opt = torch.optim.SGD(module.parameters(), lr=lr)
    start = 0
    for size in window_samples:
        batch = {
            k: v[start : start + size]
            for k, v in {"input_ids": module.data.ids, "labels": module.data.labels}.items()
        }
        start += size
        loss_sum, n = module.token_loss_sum(batch)
        (loss_sum / n).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
        opt.step()
        opt.zero_grad()
    return weights(module)


def run_kiln(module: ToyTokenModule, **trainer_kw) -> tuple[dict, object]:
    cfg = TrainerConfig(
        accelerator="cpu", precision="64-true", progress=False, log_every_n_steps=1, **trainer_kw
    )
    with float64_outputs():
        result = fit(module, cfg)
    return weights(module), result


class HostCountToy(ToyTokenModule):
    """Counts as Python ints: the loop weighs micro-batches with host arithmetic."""

    def count_items(self, batch) -> int:
        return int(super().count_items(batch))

    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        return {**out, "num_items": int(out["num_items"])}


@pytest.mark.parametrize("module_cls", [ToyTokenModule, HostCountToy])
@pytest.mark.parametrize("accumulate", [1, 2, 4])
def test_accumulated_update_equals_one_big_batch(accumulate: int, module_cls) -> None:
    b, steps = 2, 3
    got, result = run_kiln(
        module_cls(n=32, batch_size=b), max_steps=steps, accumulate_grad_batches=accumulate
    )
    want = reference_run(ToyTokenModule(n=32, batch_size=b), [accumulate * b] * steps, lr=0.1)
    assert result.global_step == steps
    for key in want:
        torch.testing.assert_close(got[key].double(), want[key], rtol=1e-10, atol=1e-12)


def test_partial_last_window_is_stepped_and_normalised_by_its_own_tokens() -> None:
    # 5 micro-batches of 2 per epoch, windows of 2: [2, 2, 1] -> 3 steps per epoch.
    got, result = run_kiln(
        ToyTokenModule(n=10, batch_size=2), max_steps=100, max_epochs=1, accumulate_grad_batches=2
    )
    want = reference_run(ToyTokenModule(n=10, batch_size=2), [4, 4, 2], lr=0.1)
    assert result.global_step == 3 and result.epoch == 1
    for key in want:
        torch.testing.assert_close(got[key].double(), want[key], rtol=1e-10, atol=1e-12)


def test_mean_of_micro_batch_means_would_differ() -> None:
    """Guards the test above: with variable lengths, naive averaging is measurably wrong."""
    module = ToyTokenModule(n=8, batch_size=2).double()
    data = {"input_ids": module.data.ids[:8], "labels": module.data.labels[:8]}
    loss_sum, n = module.token_loss_sum(data)
    per_micro = [
        module.token_loss_sum({k: v[i : i + 2] for k, v in data.items()}) for i in range(0, 8, 2)
    ]
    naive = sum(s / c for s, c in per_micro) / len(per_micro)
    assert not torch.allclose(naive, loss_sum / n, rtol=1e-6)


def test_logged_loss_is_the_window_mean() -> None:
    module = ToyTokenModule(n=8, batch_size=2).double()
    data = {"input_ids": module.data.ids[:4], "labels": module.data.labels[:4]}
    loss_sum, n = module.token_loss_sum(data)
    _, result = run_kiln(ToyTokenModule(n=8, batch_size=2), max_steps=1, accumulate_grad_batches=2)
    assert result.history[0]["step"] == 1
    assert result.history[0]["train/loss"] == pytest.approx((loss_sum / n).item(), rel=1e-9)


def test_gradient_clipping_acts_on_the_whole_window() -> None:
    # The clip norm is well below the toy's gradient norm, so clipping changes every step.
    got, result = run_kiln(
        ToyTokenModule(n=32, batch_size=2),
        max_steps=3,
        accumulate_grad_batches=2,
        gradient_clip_norm=0.05,
    )
    want = reference_run(ToyTokenModule(n=32, batch_size=2), [4] * 3, lr=0.1, clip=0.05)
    unclipped = reference_run(ToyTokenModule(n=32, batch_size=2), [4] * 3, lr=0.1)
    assert result.history[0]["train/grad_norm"] > 0.05
    for key in want:
        torch.testing.assert_close(got[key].double(), want[key], rtol=1e-10, atol=1e-12)
    assert not torch.allclose(want["head.weight"], unclipped["head.weight"])
