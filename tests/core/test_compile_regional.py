"""Regional compile (each repeated block compiled in place) and inductor's shared disk caches."""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from kiln.core import CompileConfig, TrainerConfig, fit
from kiln.core.blocks import repeated_blocks


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(width, width)

    def forward(self, x):
        return x + torch.tanh(self.linear(x))


class Stack(L.LightningModule):
    """An embedding, three identical blocks in a ModuleList, and a head."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = torch.nn.Linear(4, width)
        self.blocks = torch.nn.ModuleList(Block(width) for _ in range(3))
        self.head = torch.nn.Linear(width, 2)
        g = torch.Generator().manual_seed(1)
        self.data = TensorDataset(torch.randn(32, 4, generator=g), torch.randint(0, 2, (32,)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return {"loss": F.cross_entropy(self.head(h), y), "num_items": x.shape[0]}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=8, drop_last=True)


def train(compile_config: CompileConfig | None, steps: int = 4):
    module = Stack()
    trainer = TrainerConfig(max_steps=steps, accelerator="cpu", progress=False)
    return module, fit(module, trainer, compile_config)


def test_repeated_blocks_are_the_module_lists_of_one_class():
    module = Stack()
    assert repeated_blocks(module) == list(module.blocks)
    module.blocks.append(torch.nn.ReLU())  # mixed classes: not a stack of blocks
    assert repeated_blocks(module) == []


def test_regional_compile_compiles_the_blocks_and_trains_like_eager():
    eager, _ = train(None)
    regional, result = train(CompileConfig(mode="default", backend="aot_eager", regional=True))
    assert result.telemetry["compiled_blocks"] == 3
    assert result.telemetry["compile_time_s"] > 0
    assert not any("_orig_mod" in key for key in regional.state_dict())
    for (name, a), b in zip(
        eager.state_dict().items(), regional.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    assert all(block._compiled_call_impl is None for block in regional.blocks)  # undone


def test_regional_compile_without_repeated_blocks_says_what_is_wrong():
    module = Stack()
    module.blocks = torch.nn.ModuleList([Block(8)])
    trainer = TrainerConfig(max_steps=1, accelerator="cpu", progress=False)
    with pytest.raises(ValueError, match=r"no nn.ModuleList of blocks"):
        fit(module, trainer, CompileConfig(mode="default", backend="aot_eager", regional=True))


def test_cache_dir_must_be_a_path():
    with pytest.raises(ValueError, match=r"compile.cache_dir"):
        CompileConfig(cache_dir="")


@pytest.mark.slow
def test_a_second_fit_with_a_warm_cache_dir_reports_cache_hits(tmp_path):
    config = CompileConfig(mode="default", backend="inductor", cache_dir=str(tmp_path / "cache"))
    _, cold = train(config, steps=2)
    _, warm = train(config, steps=2)
    assert cold.telemetry["compile_cache"] == "cold"
    assert cold.telemetry["fx_graph_cache_misses"] > 0
    assert warm.telemetry["fx_graph_cache_hits"] + warm.telemetry["aot_autograd_cache_hits"] > 0
    assert warm.telemetry["compile_cache"] in ("warm", "partial")
