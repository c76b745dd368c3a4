"""Per-step hooks: what the loop calls through ``fabric.call``, in which order, with what."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from toy import ToyTokenModule
from trainers import trainer_config

from kiln.core import fit
from kiln.core.callback_points import CallbackList

cfg = partial(trainer_config, max_steps=2)


class Recorder:
    """A Fabric callback that records each per-step hook with what it can check there."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.calls: list[tuple] = []
        self.backward_losses: list[float] = []

    def _has_grads(self) -> bool:
        return all(p.grad is not None for p in self.module.parameters())

    def on_before_backward(self, loss: torch.Tensor) -> None:
        self.backward_losses.append(loss.item())
        self.calls.append(("before_backward",))

    def on_after_backward(self) -> None:
        self.calls.append(("after_backward", self._has_grads()))

    def on_before_optimizer_step(self, optimizer) -> None:
        params = [p for g in optimizer.param_groups for p in g["params"]]
        assert {id(p) for p in params} == {id(p) for p in self.module.parameters()}
        self.calls.append(("before_optimizer_step", self._has_grads()))

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        # the step's outputs: the training_step dict of this micro-batch
        counted = int((batch["labels"] != -100).sum())
        assert int(outputs["num_items"]) == counted
        assert outputs["loss"].ndim == 0
        # grads are zeroed after the optimizer step: None means the window's step was taken
        self.calls.append(("train_batch_end", batch_idx, self._has_grads()))


def test_hook_order_over_windows_of_two_micro_batches() -> None:
    module = ToyTokenModule()
    recorder = Recorder(module)
    result = fit(module, cfg(accumulate_grad_batches=2), callbacks=[recorder])

    def window(first: int) -> list[tuple]:
        return [
            ("before_backward",),
            ("after_backward", True),
            ("train_batch_end", first, True),  # the first micro-batch: still accumulating
            ("before_backward",),
            ("after_backward", True),
            ("before_optimizer_step", True),
            ("train_batch_end", first + 1, False),  # after the step (and zero_grad)
        ]

    assert recorder.calls == window(0) + window(2)
    # on_before_backward gets the loss that is backpropagated: the micro-batch's share of
    # the window's loss, so a window's shares add up to the logged window loss
    shares = recorder.backward_losses
    for i, row in enumerate(result.history):
        assert shares[2 * i] + shares[2 * i + 1] == pytest.approx(row["train/loss"], rel=1e-6)


class HookedToy(ToyTokenModule):
    """The module gets the per-step hooks too (Lightning's signatures)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def on_before_backward(self, loss):
        self.seen.append("before_backward")

    def on_after_backward(self):
        self.seen.append("after_backward")

    def on_before_optimizer_step(self, optimizer):
        self.seen.append("before_optimizer_step")

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.seen.append(f"train_batch_end {batch_idx}")


def test_module_hooks_are_called_once_per_micro_batch_and_step() -> None:
    module = HookedToy()
    fit(module, cfg(max_steps=3, accumulate_grad_batches=1))
    per_step = ["before_backward", "after_backward", "before_optimizer_step"]
    # batch_idx counts micro-batches within the epoch
    assert module.seen == [h for i in range(3) for h in [*per_step, f"train_batch_end {i}"]]


def test_the_per_step_points_call_only_the_listeners_that_define_them() -> None:
    # LightningModule's no-op hooks are never called; a defined one is, with its arguments
    calls = CallbackList([ToyTokenModule(), object()])
    calls("on_before_backward", torch.zeros(()))
    calls("on_train_batch_end", {}, None, 0)
    assert calls._resolved == {"on_before_backward": [], "on_train_batch_end": []}
    recorder = Recorder(ToyTokenModule())
    calls = CallbackList([ToyTokenModule(), recorder])
    calls("on_after_backward")
    assert [name for name, _ in calls._resolved.items() if calls._resolved[name]] == [
        "on_after_backward"
    ]
