"""Sharded checkpoints (``trainer.strategy=fsdp``) keep every promise a single-file
checkpoint makes: each rank writes its own shards (torch distributed checkpoint), the
directory is staged and renamed into place, owned by one run (``run.json``), checksummed
file by file, pruned to the last K, and ``resume='auto'`` continues bit-identically on the
CPU with ``trainer.deterministic=true``. Resuming across strategies:
``test_resume_across_strategies.py``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from toy import ToyBlocksModule, count_loads, full_weights

from kiln.core import TrainerConfig, fit, launch
from kiln.core.checkpoints.checksum import CHECKSUMS
from kiln.core.checkpoints.load import load_weights, read_checkpoint_meta
from kiln.core.checkpoints.lookup import damage, find_latest_checkpoint
from kiln.core.checkpoints.rundir import recorded_run
from kiln.core.errors import NonFiniteWeightsError

HERE = Path(__file__).parent
# shuffled data, dropout, momentum and a step schedule: every piece of state must come back
MODULE_KW = dict(n=24, batch_size=2, shuffle=True, dropout=0.2, scheduler=True, momentum=0.9)
STEPS = 8


def sharded_trainer(root: Path, max_steps: int, **kw) -> TrainerConfig:
    return TrainerConfig(
        **{
            "accelerator": "cpu",
            "devices": 2,
            "strategy": "fsdp",
            "precision": "32-true",
            "deterministic": True,
            "progress": False,
            "log_every_n_steps": 1,
            "max_steps": max_steps,
            "accumulate_grad_batches": 2,
            "seed": 7,
            "checkpoint_dir": str(root / "ckpt"),
            "checkpoint_every_n_steps": 2,
            "keep_last_k": 2,
            **kw,
        }
    )


def sharded_run(root: Path, max_steps: int, **kw) -> dict:
    """Train the blocks toy on this rank (top-level: spawned ranks import it)."""
    module = ToyBlocksModule(**MODULE_KW)
    loaded = count_loads(module)
    result = fit(module, sharded_trainer(root, max_steps, **kw))
    losses = [(row["step"], row["train/loss"]) for row in result.history]
    return {
        "weights": full_weights(module),
        "losses": losses,
        "checkpoint": result.checkpoint,
        "loaded": loaded.calls,  # this rank's samples: a resume skips those trained before
    }


def resumed_run(root: Path) -> dict:
    return sharded_run(root, STEPS, resume="auto")


def runs(root: Path) -> dict:
    """An uninterrupted run, and one stopped at step 4 and resumed to step 8."""
    out = {
        "full": sharded_run(root / "full", STEPS),
        "first": sharded_run(root / "split", 4),
        "resumed": sharded_run(root / "split", STEPS, resume="auto"),
    }
    out["overflow"] = overflowing_run(root / "overflow")
    return out


class Overflowing(ToyBlocksModule):
    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        return {**out, "loss": out["loss"] * 1e6}


def overflowing_run(root: Path) -> dict:
    """The step-1 loss (computed before the update) is finite; the update is not."""
    module = Overflowing(**{**MODULE_KW, "lr": 1e38})
    try:
        fit(module, sharded_trainer(root, STEPS, checkpoint_every_n_steps=1))
    except NonFiniteWeightsError as error:
        return {"error": str(error), "saved": sorted(p.name for p in (root / "ckpt").iterdir())}
    return {"error": None}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("sharded")
    return {"root": root, "ranks": launch(runs, 2, root)}


def test_resume_auto_of_a_sharded_run_is_bit_identical(ranks) -> None:
    for rank in ranks["ranks"]:
        full, resumed = rank["full"], rank["resumed"]
        assert [s for s, _ in resumed["losses"]] == list(range(1, STEPS + 1))
        assert resumed["losses"] == full["losses"]
        assert full["weights"].keys() == resumed["weights"].keys()
        for key, value in full["weights"].items():
            assert torch.equal(resumed["weights"][key], value), key
        # a fresh 8-step run ends the same way: only steps 5-8 were trained (2 micro-batches
        # of 2 samples per rank and step)
        assert resumed["loaded"] == (STEPS - 4) * 2 * 2


def test_each_rank_writes_its_own_shards_into_a_checksummed_pruned_directory(ranks) -> None:
    import torch.distributed.checkpoint as dcp

    ckpt = ranks["root"] / "full" / "ckpt"
    run = json.loads((ckpt / "run.json").read_text())
    newest = ["step-00000006.ckpt", "step-00000008.ckpt"]  # keep_last_k=2
    assert list(run["checkpoints"]) == newest
    assert sorted(p.name for p in ckpt.iterdir()) == ["run.json", *newest]  # no temp dir left
    step8 = ckpt / newest[-1]
    files = sorted(p.name for p in step8.iterdir())
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", CHECKSUMS, "meta.pt"]
    sums = json.loads((step8 / CHECKSUMS).read_text())
    assert sorted(sums) == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]
    assert damage(step8) is None
    assert read_checkpoint_meta(step8)["global_step"] == STEPS
    assert read_checkpoint_meta(step8)["world_size"] == 2
    # every weight and its optimizer state is stored as two halves, one in each rank's file
    metadata = dcp.FileSystemReader(str(step8)).read_metadata()
    where: dict[str, set[str]] = {}
    for index, info in metadata.storage_data.items():
        where.setdefault(index.fqn, set()).add(info.relative_path)
    for fqn in ("model.embed.weight", "model.blocks.0.linear.weight", "model.head.weight"):
        chunks = metadata.state_dict_metadata[fqn].chunks
        assert [c.offsets[0] for c in chunks] == [
            0,
            (metadata.state_dict_metadata[fqn].size[0] + 1) // 2,
        ]
        assert where[fqn] == {"__0_0.distcp", "__1_0.distcp"}, fqn
    momentum = [k for k in where if k.startswith("optimizer.state.") and "embed.weight" in k]
    assert momentum and all(where[k] == {"__0_0.distcp", "__1_0.distcp"} for k in momentum)


def test_a_damaged_shard_is_named_and_resume_auto_falls_back(ranks, tmp_path) -> None:
    shutil.copytree(ranks["root"] / "full" / "ckpt", tmp_path / "ckpt")
    newest = tmp_path / "ckpt" / "step-00000008.ckpt"
    shard = newest / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: DCP itself would load it silently
    shard.write_bytes(bytes(data))
    assert str(shard) in damage(newest)
    with pytest.warns(UserWarning, match=r"skipping damaged checkpoint .*step-00000008"):
        assert find_latest_checkpoint(tmp_path / "ckpt") == tmp_path / "ckpt" / "step-00000006.ckpt"
    # a staged directory whose save did not finish is never a checkpoint
    partial = tmp_path / "partial.ckpt"
    shutil.copytree(newest.parent / "step-00000006.ckpt", partial)
    (partial / CHECKSUMS).unlink()
    assert "did not finish" in damage(partial)


def test_a_lost_run_json_is_rebuilt_from_the_sharded_checkpoints_that_prove_themselves(
    ranks, tmp_path
) -> None:
    shutil.copytree(ranks["root"] / "full" / "ckpt", tmp_path / "ckpt")
    run = json.loads((tmp_path / "ckpt" / "run.json").read_text())
    (tmp_path / "ckpt" / "run.json").unlink()
    rebuilt = recorded_run(tmp_path / "ckpt")
    assert rebuilt.run_id == run["run_id"] and rebuilt.checkpoints == run["checkpoints"]


def test_non_finite_sharded_weights_never_reach_a_checkpoint(ranks) -> None:
    for rank in ranks["ranks"]:
        overflow = rank["overflow"]
        assert overflow["error"] is not None and "after step 1" in overflow["error"]
        assert not [name for name in overflow["saved"] if name.startswith("step-")]


def test_sharded_weights_load_into_a_plain_module_in_one_process(ranks) -> None:
    module = ToyBlocksModule(**MODULE_KW)
    load_weights(module, ranks["root"] / "full" / "ckpt" / "step-00000008.ckpt")
    for key, value in ranks["ranks"][0]["full"]["weights"].items():
        assert torch.equal(module.state_dict()[key], value), key
    other = ToyBlocksModule(blocks=3, **MODULE_KW)
    with pytest.raises(RuntimeError, match=r"does not fit ToyBlocksModule"):
        load_weights(other, ranks["root"] / "full" / "ckpt" / "step-00000008.ckpt")


@pytest.mark.process
def test_sigkill_while_a_sharded_checkpoint_is_written_keeps_the_previous_one(ranks, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    args = [sys.executable, str(HERE / "fsdp_kill_worker.py"), str(tmp_path), "6"]
    proc = subprocess.run(args, env=env, timeout=900, capture_output=True, text=True)
    assert "SIGKILL" in proc.stderr, proc.stderr[-3000:]
    ckpt = tmp_path / "ckpt"
    # killed after every rank wrote its shards, before the rename: step 6 is only staged
    assert (ckpt / "step-00000006.ckpt.tmp").is_dir()
    assert list(json.loads((ckpt / "run.json").read_text())["checkpoints"]) == [
        "step-00000002.ckpt",
        "step-00000004.ckpt",
    ]
    got = launch(resumed_run, 2, tmp_path)
    assert not (ckpt / "step-00000006.ckpt.tmp").exists()  # the leftover is cleared
    for rank, want in zip(got, ranks["ranks"], strict=True):
        assert rank["losses"] == want["full"]["losses"]
        for key, value in want["full"]["weights"].items():
            assert torch.equal(rank["weights"][key], value), key
