"""Gradient accumulation: k micro-batches of b must update the weights as one batch of k*b.

The reference is a plain PyTorch float64 loop over one big batch per window (token-weighted:
sum of per-token losses / tokens in the window), with the partial last window of an epoch
normalised by its own token count. Under ``64-true`` kiln must match it to float64 rounding
(<= 1e-12 after 5 AdamW steps), with nothing but the public API: no default-dtype tricks.
"""

from __future__ import annotations

import logging

import pytest
import torch
from toy import ToyTokenModule, reference_run, weights

from kiln.core import TrainerConfig, fit

EXACT = dict(rtol=0.0, atol=1e-12)


def run_kiln(module: ToyTokenModule, **trainer_kw) -> tuple[dict, object]:
    cfg = TrainerConfig(
        accelerator="cpu", precision="64-true", progress=False, log_every_n_steps=1, **trainer_kw
    )
    result = fit(module, cfg)
    return weights(module), result


def assert_exact(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key in want:
        assert got[key].dtype == torch.float64, key
        torch.testing.assert_close(got[key], want[key], **EXACT)


def assert_logged_losses(result, want: list[float]) -> None:
    logged = [row["train/loss"] for row in result.history]
    assert [row["step"] for row in result.history] == list(range(1, len(want) + 1))
    assert logged == pytest.approx(want, rel=0.0, abs=1e-12)


class HostCountToy(ToyTokenModule):
    """Counts as Python ints: the loop weighs micro-batches with host arithmetic."""

    def count_items(self, batch) -> int:
        return int(super().count_items(batch))

    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        return {**out, "num_items": int(out["num_items"])}


@pytest.mark.parametrize("module_cls", [ToyTokenModule, HostCountToy])
@pytest.mark.parametrize("accumulate", [1, 2, 4, 8])
def test_accumulated_adamw_update_equals_one_big_batch_in_float64(accumulate, module_cls) -> None:
    b, steps = 2, 5
    kw = dict(n=80, batch_size=b, lr=0.01, optimizer="adamw")
    got, result = run_kiln(module_cls(**kw), max_steps=steps, accumulate_grad_batches=accumulate)
    want, losses = reference_run(ToyTokenModule(**kw), [accumulate * b] * steps)
    assert result.global_step == steps
    assert_exact(got, want)
    assert_logged_losses(result, losses)


def test_partial_last_window_is_stepped_and_normalised_by_its_own_tokens() -> None:
    # 9 micro-batches of 2 per epoch, windows of 4: [8, 8, 2] -> 3 steps per epoch; 5 steps
    # run into the second epoch.
    kw = dict(n=18, batch_size=2, lr=0.01, optimizer="adamw")
    got, result = run_kiln(
        ToyTokenModule(**kw), max_steps=5, max_epochs=2, accumulate_grad_batches=4
    )
    want, losses = reference_run(ToyTokenModule(**kw), [8, 8, 2, 8, 8])
    assert result.global_step == 5 and result.epoch == 1
    assert_exact(got, want)
    assert_logged_losses(result, losses)


def test_a_window_longer_than_the_epoch_is_said_once_in_the_log(caplog) -> None:
    # 8 micro-batches of 2 per epoch, windows of 20: each step is one whole epoch
    kw = dict(n=16, batch_size=2, lr=0.01, optimizer="adamw")
    with caplog.at_level(logging.WARNING):
        _, result = run_kiln(ToyTokenModule(**kw), max_steps=3, accumulate_grad_batches=20)
    assert result.global_step == 3 and result.epoch == 3  # three epochs done
    said = [r.getMessage() for r in caplog.records if "accumulate_grad_batches" in r.getMessage()]
    assert said == [
        "trainer.accumulate_grad_batches=20 is more than the 8 micro-batches of an epoch "
        "(per rank): every optimizer step is a partial window of 8 micro-batches, one step per "
        "epoch (the update of one batch of all 8)"
    ]


def test_mean_of_micro_batch_means_would_differ() -> None:
    """Guards the tests above: with variable lengths, naive averaging is measurably wrong."""
    module = ToyTokenModule(n=8, batch_size=2).double()
    data = {"input_ids": module.data.ids[:8], "labels": module.data.labels[:8]}
    loss_sum, n = module.token_loss_sum(data)
    per_micro = [
        module.token_loss_sum({k: v[i : i + 2] for k, v in data.items()}) for i in range(0, 8, 2)
    ]
    naive = sum(s / c for s, c in per_micro) / len(per_micro)
    assert not torch.allclose(naive, loss_sum / n, rtol=1e-6)


def test_gradient_clipping_acts_on_the_whole_window() -> None:
    # The clip norm is well below the toy's gradient norm, so clipping changes every step.
    kw = dict(n=32, batch_size=2)
    got, result = run_kiln(
        ToyTokenModule(**kw), max_steps=3, accumulate_grad_batches=2, gradient_clip_norm=0.05
    )
    want, _ = reference_run(ToyTokenModule(**kw), [4] * 3, clip=0.05)
    unclipped, _ = reference_run(ToyTokenModule(**kw), [4] * 3)
    assert result.history[0]["train/grad_norm"] > 0.05
    assert_exact(got, want)
    assert not torch.allclose(want["head.weight"], unclipped["head.weight"])


def test_window_loss_sums_read_together_equal_each_window_summed_in_order() -> None:
    # The step keeps each micro-batch's loss and count; the sync point weighs and sums them
    # for all pending steps at once. A short window among whole ones (the end of an epoch),
    # device counts and mixed loss dtypes must give what summing each window alone gives.
    from kiln.core.loop.step import StepOutput, window_loss_sums

    g = torch.Generator().manual_seed(0)
    lengths, outputs, want = [4, 4, 1, 3, 4], [], []
    for step, length in enumerate(lengths, start=1):
        losses = [torch.rand((), generator=g, dtype=torch.float32) for _ in range(length)]
        counts = [int(n) for n in torch.randint(1, 1000, (length,), generator=g)]
        if step == 3:
            counts = [torch.tensor(n) for n in counts]  # counts from training_step tensors
        if step == 4:
            losses = [loss.double() for loss in losses]
        total = losses[0].double() * counts[0]
        for loss, n in zip(losses[1:], counts[1:], strict=True):
            total = total + loss.double() * n
        outputs.append(StepOutput(step, losses, counts, sum(counts), None))
        want.append(total.item())
    got = window_loss_sums(outputs, torch.device("cpu"))
    assert got.dtype == torch.float64
    assert got.tolist() == want  # bit for bit: the same roundings in the same order
    assert window_loss_sums(outputs[:2], torch.device("cpu")).tolist() == want[:2]
