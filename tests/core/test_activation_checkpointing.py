"""``trainer.activation_checkpointing=true`` on a plain module with repeated blocks: each block
is wrapped in torch's non-reentrant ``checkpoint_wrapper`` for the fit (and unwrapped after)
and runs again in the backward (its recomputation, counted); every step's gradients equal
those of the same run without it, in float64, on one process
and on 2 gloo ranks; the activations kept for the backward shrink, measured; a module that
cannot be checkpointed fails before training, naming itself and what is supported.

The HF and timm wrappers' own hooks are tested in
``tests/models/test_wrappers_activation_checkpointing.py``.
"""

from __future__ import annotations

import ctypes

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from grads import Grads, assert_same_steps
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from toy import ToyTokenModule, full_weights
from trainers import trainer_config

from kiln.core import TrainerConfig, fit, launch
from kiln.core.loop.activation_checkpointing import activation_checkpointing
from kiln.experiments.bench.step_memory import step_peak_bytes

WRAPPED = "_checkpoint_wrapped_module."


class Block(nn.Module):
    def __init__(self, width: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, hidden), nn.Linear(hidden, width)
        self.norm, self.drop = nn.LayerNorm(width), nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.drop(self.down(F.gelu(self.up(x)))))


class BlockStack(L.LightningModule):
    """Embedding, a ModuleList of residual MLP blocks, a head; token classification."""

    def __init__(
        self, depth=4, width=16, hidden=64, dropout=0.1, n=32, seq=6, batch_size=4
    ) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(11, width)
        self.blocks = nn.ModuleList(Block(width, hidden, dropout) for _ in range(depth))
        self.head = nn.Linear(width, 11)
        g = torch.Generator().manual_seed(1)
        self.data = TensorDataset(
            torch.randint(0, 11, (n, seq), generator=g), torch.randint(0, 11, (n, seq), generator=g)
        )
        self.batch_size = batch_size

    def training_step(self, batch, batch_idx):
        ids, labels = batch
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        loss = F.cross_entropy(self.head(x).flatten(0, 1), labels.flatten())
        return {"loss": loss, "num_items": len(ids)}

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size, shuffle=True)


def train(checkpointing: bool, devices: int = 1, strategy: str = "auto") -> dict:
    """Top-level so spawned ranks can import it: 4 AdamW steps with dropout, float64."""
    module = BlockStack()
    grads = Grads(module, strip=WRAPPED)
    # a checkpointed block runs again in the backward (recomputation): its layers twice
    calls = []
    up = next(m for m in module.blocks[0].modules() if isinstance(m, nn.Linear))
    up.register_forward_hook(lambda *_: calls.append(torch.is_grad_enabled()))
    cfg = trainer_config(
        devices=devices,
        precision="64-true",
        accumulate_grad_batches=2,
        activation_checkpointing=checkpointing,
        strategy=strategy,
    )
    result = fit(module, cfg, callbacks=[grads])
    return {
        "grads": grads.steps,
        "weights": full_weights(module),
        "telemetry": result.telemetry,
        "blocks": [type(b).__name__ for b in module.blocks],
        "block_calls": sum(calls),
    }


def train_both(devices: int, strategy: str = "auto") -> tuple[dict, dict]:
    """Both runs in one launch (the second fit reuses the ranks' process group)."""
    return train(False, devices, strategy), train(True, devices, strategy)


def assert_same_grads(got: dict, want: dict) -> None:
    # 4 steps of 2 micro-batches (and the FLOP count's forward): with checkpointing the
    # block runs once more for each micro-batch, recomputing its activations in the backward
    assert want["block_calls"] >= 8 and got["block_calls"] - want["block_calls"] == 8
    assert_same_steps(got["grads"], want["grads"], 4)
    for name, value in want["weights"].items():
        torch.testing.assert_close(got["weights"][name], value, rtol=0, atol=1e-12)


def test_checkpointed_blocks_give_the_same_gradients_on_one_process():
    plain, checkpointed = train(False), train(True)
    assert_same_grads(checkpointed, plain)
    assert checkpointed["telemetry"]["activation_checkpointing"] == "checkpoint_wrapper x 4 blocks"
    assert plain["telemetry"]["activation_checkpointing"] is None
    assert checkpointed["blocks"] == ["Block"] * 4  # unwrapped after the fit


@pytest.mark.process  # a 2-rank launch; the FSDP case below runs in make test-all too
def test_checkpointed_blocks_give_the_same_gradients_on_two_gloo_ranks():
    for plain, checkpointed in launch(train_both, 2, 2):
        assert_same_grads(checkpointed, plain)
        assert checkpointed["telemetry"]["activation_checkpointing"] is not None


# a 2-rank launch; one process proves the gradients, test_fsdp.py the wrapped blocks sharded
@pytest.mark.long
def test_checkpointed_blocks_give_the_same_gradients_under_fsdp_on_two_gloo_ranks():
    # the wrappers are what FSDP2 shards (found as the repeated blocks); each rank's
    # gradient shards match
    for plain, checkpointed in launch(train_both, 2, 2, "fsdp"):
        assert_same_grads(checkpointed, plain)
        assert checkpointed["telemetry"]["activation_checkpointing"] == (
            "checkpoint_wrapper x 4 blocks"
        )
        half = sum(v.numel() for v in plain["grads"][0].values())
        assert half < sum(v.numel() for v in plain["weights"].values())  # sharded


def test_the_state_dict_keeps_the_blocks_own_keys():
    module = BlockStack()
    keys = list(module.state_dict())
    with activation_checkpointing(module, True):
        assert all(WRAPPED not in k for k in module.state_dict())
        assert list(module.state_dict()) == keys
        module.load_state_dict(BlockStack().state_dict())  # a plain run's checkpoint loads


def test_activations_kept_for_the_backward_shrink():
    # Tensors of >= 1 MiB get their own mmap, returned on free, so the resident set follows
    # what is alive (glibc's dynamic threshold would serve them from a heap that fragments).
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 2**20)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pytest.skip("needs glibc to measure the CPU peak")
    # big activations (12 blocks x 4096 tokens x 1024 hidden, fp32: ~0.4 GiB kept without
    # checkpointing; the blocks' 1 MiB inputs and one block's recompute with it)
    module = BlockStack(depth=12, width=64, hidden=1024, dropout=0.0)
    batch = (torch.randint(0, 11, (32, 128)), torch.randint(0, 11, (32, 128)))

    def step():
        module.training_step(batch, 0)["loss"].backward()
        module.zero_grad(set_to_none=True)

    step()  # allocate the gradients once, outside the measured steps
    plain = step_peak_bytes(step, torch.device("cpu"))
    with activation_checkpointing(module, True):
        step()
        checkpointed = step_peak_bytes(step, torch.device("cpu"))
    if plain is None:
        pytest.skip("needs Linux's /proc/self (VmHWM) to measure the CPU peak")
    print(f"step peak: {plain / 2**20:.0f} MiB plain, {checkpointed / 2**20:.0f} MiB checkpointed")
    assert checkpointed < 0.5 * plain


def test_a_module_without_blocks_or_hook_fails_before_training_naming_it():
    module = ToyTokenModule()
    module.training_step = lambda *a: pytest.fail("trained")
    with pytest.raises(ValueError) as error:
        fit(module, TrainerConfig(accelerator="cpu", progress=False, activation_checkpointing=True))
    message = str(error.value)
    assert "ToyTokenModule cannot be checkpointed" in message
    assert "set_activation_checkpointing" in message and "repeated blocks" in message
    assert "trainer.activation_checkpointing=false" in message
