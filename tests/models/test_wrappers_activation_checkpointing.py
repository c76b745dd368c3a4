"""``trainer.activation_checkpointing=true`` on kiln.models' wrappers goes through their own
hook (``set_activation_checkpointing``): HF models use their non-reentrant activation
checkpointing, timm models ``set_grad_checkpointing``. Each block then runs again in the
backward (its recomputation, counted), and every step's gradients equal those of the run
without it (float64, <= 1e-12), on one process and on 2 gloo ranks; a model that cannot fails
before training, naming it."""

from __future__ import annotations

import pytest
import torch
from grads import Grads, assert_same_steps
from test_float64 import build, rows
from torch.utils.data import DataLoader
from trainers import trainer_config

import kiln.models as km
from kiln.core import TrainerConfig, fit, launch
from kiln.core.blocks import repeated_blocks
from kiln.models.testing import tiny_model


def vit(data: list[dict]):
    torch.manual_seed(0)
    model = tiny_model("vit-tiny", num_classes=3)
    model.train_dataloader = lambda: DataLoader(data, batch_size=2)
    model.val_dataloader = lambda: None
    return model


def images(n: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    return [
        {"pixel_values": torch.randn(3, 32, 32, generator=g), "labels": torch.tensor(i % 3)}
        for i in range(n)
    ]


def model_and_data(name: str):
    if name == "vit-tiny":
        return vit(images(16))
    return build(name, rows(name, 16), 2)


class BlockCalls:
    """Counts the calls that record gradients (validation runs none here) of the first
    linear layer inside a model's first repeated block: a checkpointed block keeps no
    activations and runs again in the backward to recompute them, so twice as often as a
    plain one. (transformers checkpoints the block's ``forward``, not its ``__call__``: the
    block's own hooks run once, its layers' twice.)"""

    def __init__(self, model) -> None:
        self.calls = 0
        block = repeated_blocks(model)[0]
        linear = next(m for m in block.modules() if isinstance(m, torch.nn.Linear))
        linear.register_forward_hook(self._count)

    def _count(self, *_) -> None:
        self.calls += torch.is_grad_enabled()


def train(name: str, checkpointing: bool, devices: int = 1, strategy: str = "auto") -> dict:
    model = model_and_data(name)
    grads, block = Grads(model), BlockCalls(model)
    cfg = trainer_config(
        devices=devices,
        precision="64-true",
        max_steps=3,
        accumulate_grad_batches=2,
        count_flops=False,
        activation_checkpointing=checkpointing,
        strategy=strategy,
    )
    fit(model, cfg, callbacks=[grads])
    return {"grads": grads.steps, "block_calls": block.calls}


def train_all(devices: int, strategy: str) -> dict:
    """Every model with and without checkpointing, in one launch on 2 ranks."""
    return {
        (name, on): train(name, on, devices, strategy)
        for name in ("llama-tiny-lm", "vit-tiny")
        for on in (False, True)
    }


def assert_checkpointed_with_the_same_grads(checkpointed: dict, plain: dict) -> None:
    # 3 steps of 2 micro-batches: one forward each, plus one recomputation when checkpointed
    assert plain["block_calls"] == 6
    assert checkpointed["block_calls"] == 2 * 6
    assert_same_steps(checkpointed["grads"], plain["grads"], 3)


@pytest.mark.parametrize("name", ["llama-tiny-lm", "bert-tiny-cls", "vit-tiny"])
def test_the_models_own_checkpointing_recomputes_and_gives_the_same_gradients(name) -> None:
    assert_checkpointed_with_the_same_grads(train(name, True), train(name, False))


@pytest.mark.slow  # 2 ranks x 4 fits of HF and timm models; the plain module's is fast
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_the_models_own_checkpointing_recomputes_and_gives_the_same_gradients_on_two_ranks(
    strategy,
):
    ranks = launch(train_all, 2, 2, strategy)
    for rank in ranks:
        for name in ("llama-tiny-lm", "vit-tiny"):
            assert_checkpointed_with_the_same_grads(rank[(name, True)], rank[(name, False)])


def test_checkpointing_is_switched_off_after_the_fit() -> None:
    hf, timm = model_and_data("llama-tiny-lm"), vit(images(4))
    for model in (hf, timm):
        fit(
            model,
            TrainerConfig(
                accelerator="cpu", max_steps=1, progress=False, activation_checkpointing=True
            ),
        )
    assert not hf.model.is_activation_checkpointing
    assert not hasattr(hf.model, "_require_grads_hook")
    assert not timm.model.grad_checkpointing


def test_an_hf_model_without_support_fails_before_training_naming_it() -> None:
    model = model_and_data("llama-tiny-lm")
    model.model.supports_gradient_checkpointing = False  # as HF's unsupported classes say
    model.training_step = lambda *a: pytest.fail("trained")
    with pytest.raises(
        ValueError,
        match=r"LlamaForCausalLM \(HF model_type 'llama'\) does not "
        r"support activation checkpointing",
    ):
        fit(model, TrainerConfig(accelerator="cpu", progress=False, activation_checkpointing=True))


def test_a_timm_model_without_support_fails_before_training_naming_it() -> None:
    model = km.create_model("timm", arch="dla34", num_classes=3)  # timm asserts
    with pytest.raises(ValueError, match=r"timm model 'dla34' does not support gradient"):
        fit(model, TrainerConfig(accelerator="cpu", progress=False, activation_checkpointing=True))
