"""Resume on another number of devices: a checkpoint of N ranks continues on M ranks when the
global batch (devices x micro-batch x accumulation) stays the same, and with dropout off the
run ends within 1e-12 (float64) of the uninterrupted one, 2 -> 1 and 1 -> 2 gloo ranks. Step k
trains on the same samples on any world size (``kiln.core.loop.data``), so the uninterrupted runs
on 1 and 2 ranks agree too. Under FSDP a sharded checkpoint of 2 ranks resumes on 1 (FSDP on
one process: one shard), on 3, and one of 3 or of 1 rank on 2: torch distributed checkpoint
reshards it on load. A world size change that cannot keep the global batch fails before
training, naming both world sizes and the accumulation that would keep it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from toy import ToyBlocksModule, ToyTokenModule, count_loads, full_weights, weights

from kiln.core import TrainerConfig, fit, launch

# shuffled, a step schedule, AdamW; no dropout (each rank's stream cannot carry over)
MODULE_KW = dict(n=24, batch_size=2, shuffle=True, scheduler=True, optimizer="adamw", lr=0.01)
GLOBAL_BATCH = 8  # 3 steps an epoch: 20 steps cross 6 epochs, step 10 stands mid-epoch
STEPS, STOP = 20, 10


def config(root: Path, devices: int, steps: int, resume: str | None, **kw) -> TrainerConfig:
    kw = {"accumulate_grad_batches": GLOBAL_BATCH // (2 * devices), **kw}
    return TrainerConfig(
        accelerator="cpu",
        devices=devices,
        precision="64-true",
        max_steps=steps,
        log_every_n_steps=1,
        checkpoint_dir=str(root / "ckpt"),
        checkpoint_every_n_steps=5,
        resume=resume,
        seed=3,
        progress=False,
        **kw,
    )


def run(root: Path, devices: int, steps: int, resume: str | None = None) -> dict:
    """Top-level so spawned ranks can import it."""
    module = ToyTokenModule(**MODULE_KW)
    loaded = count_loads(module)
    result = fit(module, config(root, devices, steps, resume))
    return {
        "weights": weights(module),
        "history": result.history,
        "step": result.global_step,
        "loaded": loaded.calls,  # this rank's samples: a resume skips those trained before
    }


def full_and_stopped(root: Path, devices: int) -> tuple[dict, dict]:
    """An uninterrupted run and one stopped at step STOP, in one launch."""
    return run(root / "full", devices, STEPS), run(root / "stopped", devices, STOP)


def assert_same_run(got: dict, want: dict) -> None:
    assert got["step"] == want["step"] == STEPS
    for key, value in want["weights"].items():
        torch.testing.assert_close(got["weights"][key], value, rtol=0, atol=1e-12, msg=key)
    assert [r["step"] for r in got["history"]] == list(range(1, STEPS + 1))
    logged = [r["train/loss"] for r in got["history"]]
    assert logged == pytest.approx([r["train/loss"] for r in want["history"]], rel=0, abs=1e-12)


def assert_resumed(got: dict, devices: int, global_batch: int) -> None:
    """It continued from step STOP: a fresh run on the new world size ends like the
    uninterrupted one too, but loads every step's samples, not only those after STOP."""
    assert got["loaded"] == (STEPS - STOP) * global_batch // devices


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict:
    """Runs on 2 gloo ranks: uninterrupted, and stopped at step 10 (a copy of its checkpoint)."""
    root = tmp_path_factory.mktemp("two")
    full, stopped = launch(full_and_stopped, 2, root, 2)[0]
    copy = root / "step-10.ckpt"
    shutil.copytree(root / "stopped" / "ckpt" / f"step-{STOP:08d}.ckpt", copy)
    return {"root": root, "full": full, "stopped": stopped, "copy": copy}


def test_a_two_rank_checkpoint_resumes_on_one_rank(two_ranks) -> None:
    resumed = run(two_ranks["root"] / "stopped", 1, STEPS, "auto")  # accumulation 2 -> 4
    assert_same_run(resumed, two_ranks["full"])
    assert_resumed(resumed, 1, GLOBAL_BATCH)


@pytest.mark.long  # a second launch: 2 -> 1 proves a world size change in the fast tier
def test_a_one_rank_checkpoint_resumes_on_two_ranks(tmp_path, two_ranks) -> None:
    full = run(tmp_path / "full", 1, STEPS)
    assert_same_run(full, two_ranks["full"])  # step k: the same samples on 1 and 2 ranks
    run(tmp_path / "split", 1, STOP)
    resumed = launch(run, 2, tmp_path / "split", 2, STEPS, "auto")  # accumulation 4 -> 2
    for rank in resumed:
        assert_same_run(rank, full)
        assert_resumed(rank, 2, GLOBAL_BATCH)


def test_another_global_batch_fails_naming_both_world_sizes_and_what_works(
    tmp_path, two_ranks
) -> None:
    module = ToyTokenModule(**MODULE_KW)
    module.training_step = lambda *a: pytest.fail("trained")
    cfg = config(tmp_path, 1, STEPS, str(two_ranks["copy"]), accumulate_grad_batches=2)
    with pytest.raises(ValueError) as error:
        fit(module, cfg)
    message = str(error.value)
    assert "written by a run on 2 processes, this run has 1" in message
    assert "2 x 2 x 2 = 8, this run's 1 x 2 x 2 = 4" in message
    assert "set trainer.accumulate_grad_batches=4 to keep it" in message


def test_a_global_batch_no_accumulation_keeps_fails_saying_so(tmp_path, two_ranks) -> None:
    module = ToyTokenModule(**{**MODULE_KW, "batch_size": 3})
    cfg = config(tmp_path, 1, STEPS, str(two_ranks["copy"]), accumulate_grad_batches=3)
    with pytest.raises(
        ValueError,
        match=r"no trainer.accumulate_grad_batches keeps it with "
        r"micro-batches of 3 on 1 processes",
    ):
        fit(module, cfg)


FSDP_KW = {**MODULE_KW, "n": 36}  # a global batch of 12: 3 steps an epoch, again
FSDP_BATCH = 12


def fsdp_run(root: Path, devices: int, steps: int, resume: str | None = None) -> dict:
    """Top-level so spawned ranks can import it."""
    module = ToyBlocksModule(**FSDP_KW)
    loaded = count_loads(module)
    accumulate = FSDP_BATCH // (FSDP_KW["batch_size"] * devices)
    cfg = config(root, devices, steps, resume, strategy="fsdp", accumulate_grad_batches=accumulate)
    result = fit(module, cfg)
    return {
        "weights": full_weights(module),
        "history": result.history,
        "step": result.global_step,
        "loaded": loaded.calls,
    }


def fsdp_on_two(root: Path) -> tuple[dict, dict]:
    return fsdp_run(root / "full", 2, STEPS), fsdp_run(root / "two", 2, STOP)


def fsdp_on_three(root: Path) -> tuple[dict, dict]:
    """The 2-rank checkpoint resumed on 3 ranks, and a 3-rank run stopped at step 10."""
    return fsdp_run(root / "two", 3, STEPS, "auto"), fsdp_run(root / "three", 3, STOP)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> dict:
    """FSDP runs on 2 ranks: uninterrupted, and stopped at step 10 (kept twice: the 1-rank
    and the 3-rank resumes each continue a copy)."""
    root = tmp_path_factory.mktemp("fsdp")
    full, _ = launch(fsdp_on_two, 2, root)[0]
    shutil.copytree(root / "two", root / "two-to-one")
    return {"root": root, "full": full}


@pytest.fixture(scope="module")
def grown(sharded) -> list[dict]:
    """On 3 ranks: the 2-rank checkpoint resumed, and a run stopped at step 10."""
    return [resumed for resumed, _ in launch(fsdp_on_three, 3, sharded["root"])]


def max_difference(got: dict, want: dict) -> float:
    return max((got["weights"][k] - v).abs().max().item() for k, v in want["weights"].items())


@pytest.mark.long  # an FSDP launch; test_fsdp_checkpoint.py loads sharded weights in one process
def test_a_sharded_checkpoint_of_two_ranks_resumes_on_one(sharded) -> None:
    # one process, trainer.strategy=fsdp: a mesh of one rank, one shard; accumulation 3 -> 6
    resumed = fsdp_run(sharded["root"] / "two-to-one", 1, STEPS, "auto")
    print(f"fsdp 2 -> 1: max abs weight difference {max_difference(resumed, sharded['full'])}")
    assert_same_run(resumed, sharded["full"])
    assert_resumed(resumed, 1, FSDP_BATCH)


@pytest.mark.long  # two FSDP launches: a further case of resharding
def test_a_sharded_checkpoint_of_one_rank_resumes_on_two(tmp_path, sharded) -> None:
    fsdp_run(tmp_path, 1, STOP)
    assert (tmp_path / "ckpt" / f"step-{STOP:08d}.ckpt" / "__0_0.distcp").is_file()  # sharded
    for rank in launch(fsdp_run, 2, tmp_path, 2, STEPS, "auto"):  # accumulation 6 -> 3
        print(f"fsdp 1 -> 2: max abs weight difference {max_difference(rank, sharded['full'])}")
        assert_same_run(rank, sharded["full"])
        assert_resumed(rank, 2, FSDP_BATCH)


@pytest.mark.process  # a 3-rank launch; 2 -> 1 and 1 -> 2 prove resharding in the fast tier
def test_a_sharded_checkpoint_of_two_ranks_resumes_on_three(sharded, grown) -> None:
    assert (sharded["root"] / "two" / "ckpt" / f"step-{STEPS:08d}.ckpt").is_dir()  # sharded
    for rank in grown:
        assert_same_run(rank, sharded["full"])
        assert_resumed(rank, 3, FSDP_BATCH)


@pytest.mark.slow  # a third FSDP launch; growing the world is tested in make test-all
def test_a_sharded_checkpoint_of_three_ranks_resumes_on_two(sharded, grown) -> None:
    for rank in launch(fsdp_run, 2, sharded["root"] / "three", 2, STEPS, "auto"):
        assert_same_run(rank, sharded["full"])
        assert_resumed(rank, 2, FSDP_BATCH)
