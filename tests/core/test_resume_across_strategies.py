"""A checkpoint resumes under another strategy: every strategy writes the same torch
distributed checkpoint, keyed by parameter name, and its planner reshards on load. In float64
(shuffled data, a step schedule, AdamW: optimizer state and the data position must come back)
each resumed run ends within 1e-12 of the uninterrupted one: DDP on 2 ranks -> FSDP on 2,
FSDP on 2 -> one plain process, FSDP on 2 -> DDP on 3 (the global batch kept)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_resume_world_size import (
    FSDP_BATCH,
    FSDP_KW,
    STEPS,
    STOP,
    assert_resumed,
    assert_same_run,
    config,
    max_difference,
)
from toy import ToyBlocksModule, count_loads, full_weights

from kiln.core import fit, launch

# 2- and 3-rank launches (about 70 s here): make test-all's process tier
pytestmark = pytest.mark.process


def blocks_run(
    root: Path, devices: int, steps: int, strategy: str, resume: str | None = None
) -> dict:
    """The blocks toy on this rank under ``strategy`` (top-level: spawned ranks import it)."""
    module = ToyBlocksModule(**FSDP_KW)
    loaded = count_loads(module)
    accumulate = FSDP_BATCH // (FSDP_KW["batch_size"] * devices)
    cfg = config(
        root, devices, steps, resume, strategy=strategy, accumulate_grad_batches=accumulate
    )
    result = fit(module, cfg)
    return {
        "weights": full_weights(module),
        "history": result.history,
        "step": result.global_step,
        "loaded": loaded.calls,  # this rank's samples: a resume skips those trained before
    }


def on_two_ranks(root: Path) -> dict:
    """Uninterrupted DDP and FSDP runs, a DDP run stopped at step STOP and continued under
    FSDP, and an FSDP run stopped at step STOP (for the other directions)."""
    out = {
        "ddp": blocks_run(root / "ddp", 2, STEPS, "ddp"),
        "fsdp": blocks_run(root / "fsdp", 2, STEPS, "fsdp"),
    }
    blocks_run(root / "ddp-to-fsdp", 2, STOP, "ddp")
    out["ddp-to-fsdp"] = blocks_run(root / "ddp-to-fsdp", 2, STEPS, "fsdp", "auto")
    blocks_run(root / "fsdp-stopped", 2, STOP, "fsdp")
    return out


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("strategies")
    ranks = launch(on_two_ranks, 2, root)
    return {"root": root, "ranks": ranks}


def test_ddp_and_fsdp_train_the_same_run(two) -> None:
    for rank in two["ranks"]:
        difference = max_difference(rank["ddp"], rank["fsdp"])
        print(f"ddp 2 vs fsdp 2: max abs weight difference {difference}")
        assert_same_run(rank["ddp"], rank["fsdp"])


def test_a_ddp_checkpoint_of_two_ranks_resumes_under_fsdp_on_two(two) -> None:
    for rank in two["ranks"]:
        resumed = rank["ddp-to-fsdp"]
        print(f"ddp 2 -> fsdp 2: max abs weight difference {max_difference(resumed, rank['ddp'])}")
        assert_same_run(resumed, rank["ddp"])
        assert_resumed(resumed, 2, FSDP_BATCH)


def test_an_fsdp_checkpoint_of_two_ranks_resumes_in_one_plain_process(two, tmp_path) -> None:
    shutil.copytree(two["root"] / "fsdp-stopped", tmp_path, dirs_exist_ok=True)
    resumed = blocks_run(tmp_path, 1, STEPS, "auto", "auto")  # no process group, no sharding
    want = two["ranks"][0]["fsdp"]
    print(f"fsdp 2 -> 1 process: max abs weight difference {max_difference(resumed, want)}")
    assert_same_run(resumed, want)
    assert_resumed(resumed, 1, FSDP_BATCH)


def test_an_fsdp_checkpoint_of_two_ranks_resumes_under_ddp_on_three(two, tmp_path) -> None:
    shutil.copytree(two["root"] / "fsdp-stopped", tmp_path, dirs_exist_ok=True)
    want = two["ranks"][0]["fsdp"]
    for rank in launch(blocks_run, 3, tmp_path, 3, STEPS, "ddp", "auto"):  # accumulation 3 -> 2
        print(f"fsdp 2 -> ddp 3: max abs weight difference {max_difference(rank, want)}")
        assert_same_run(rank, want)
        assert_resumed(rank, 3, FSDP_BATCH)
