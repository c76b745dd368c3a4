"""Seeds: identical starting weights on every rank, a distinct dropout stream per rank
(seed + rank), each rank's stream restored exactly on resume, and the weights hash."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from toy import ToyTokenModule, weights
from trainers import trainer_config

from kiln.core import TrainerConfig, fit, launch, rank_seed, weights_hash


class MaskToy(ToyTokenModule):
    """Records the dropout mask of every micro-batch it trains on."""

    def __init__(self, **kw) -> None:
        super().__init__(dropout=0.5, **kw)
        self.masks: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        if not batch["input_ids"].is_meta:  # the loop's one FLOP count runs it on meta tensors
            self.masks.append(self.drop(torch.ones(64)) != 0)
        return super().training_step(batch, batch_idx)


def trainer(tmp: str, max_steps: int, **kw) -> TrainerConfig:
    return trainer_config(
        devices=2,
        deterministic=True,
        max_steps=max_steps,
        checkpoint_dir=tmp,
        checkpoint_every_n_steps=2,
        seed=5,
        **kw,
    )


def two_ranks(tmp: str, split: bool) -> dict:
    """Top-level so spawned workers can import it: 4 steps, or 2 then a resume to 4."""
    rank = int(os.environ["RANK"])
    module = MaskToy(n=32, batch_size=2)
    initial = weights_hash(module)
    with torch.no_grad():
        module.head.bias.add_(rank)  # ranks built different weights: rank 0's must win
    if split:
        fit(MaskToy(n=32, batch_size=2), trainer(tmp, 2))
        result = fit(module, trainer(tmp, 4, resume="auto"))
    else:
        result = fit(module, trainer(tmp, 4))
    return {
        "rank": rank,
        "initial": initial,
        "final": weights_hash(module),
        "weights": weights(module),
        "masks": torch.stack(module.masks),
        "losses": [row["train/loss"] for row in result.history],
    }


@pytest.mark.slow  # 2 x 2 gloo processes, ~1-2 min on a shared 2-core machine
def test_two_ranks_share_weights_draw_own_dropout_and_resume_exactly(tmp_path: Path) -> None:
    full = launch(two_ranks, 2, str(tmp_path / "full"), False)
    split = launch(two_ranks, 2, str(tmp_path / "split"), True)
    for runs in (full, split):
        # the same model on both ranks (DDP broadcast rank 0's), trained in lockstep
        assert runs[0]["final"] == runs[1]["final"]
        # but each rank drew its own dropout masks
        assert not torch.equal(runs[0]["masks"][0], runs[1]["masks"][0])
    for a, b in zip(full, split, strict=True):
        # the resumed rank restored its own stream: steps 3-4 draw what the full run drew
        assert torch.equal(a["masks"][2:], b["masks"])
        assert a["final"] == b["final"]
        assert a["losses"] == b["losses"]


def test_rank_seed_offsets_by_rank() -> None:
    assert [rank_seed(7, r) for r in range(3)] == [7, 8, 9]
    with pytest.raises(ValueError, match="rank=-1"):
        rank_seed(7, -1)


def test_weights_hash_sees_every_bit_and_only_the_weights() -> None:
    a, b = ToyTokenModule(), ToyTokenModule()  # the toy seeds its own init
    assert weights_hash(a) == weights_hash(b)
    assert weights_hash(a) == weights_hash(torch.compile(a))  # no _orig_mod. in keys
    with torch.no_grad():
        b.head.bias[0] = torch.nextafter(b.head.bias[0], torch.tensor(1.0))
    assert weights_hash(a) != weights_hash(b)
    assert len(weights_hash(a)) == 64


def test_weights_hash_covers_zero_dim_buffers() -> None:
    # BatchNorm's num_batches_tracked is a 0-dim Long: every timm ResNet has one
    norm = torch.nn.BatchNorm1d(2)
    before = weights_hash(norm)
    norm.num_batches_tracked += 1
    assert weights_hash(norm) != before
