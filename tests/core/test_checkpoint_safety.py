"""Checkpoints are never lost or poisoned: a directory belongs to one run, only finite
weights are written, a damaged file is named and skipped, and a resumed run continues
exactly from the newest intact checkpoint (compared with an uninterrupted run)."""

from __future__ import annotations

import json
import re
import shutil
import zipfile
from pathlib import Path

import pytest
import torch
from checkpoint_files import flip_a_byte, shard_file, truncate
from test_resume import MODULE_KW, assert_same_weights, losses, trainer
from toy import ToyTokenModule, count_loads, weights

from kiln.core import NonFiniteLossError, fit
from kiln.core.checkpoints.checksum import write_checksums
from kiln.core.checkpoints.load import read_checkpoint_meta
from kiln.core.checkpoints.rundir import CheckpointDirError, DamagedCheckpointError
from kiln.core.distributed.threads import default_threads_per_rank
from kiln.core.errors import EmptyEpochError, NonFiniteWeightsError

STEPS = 8  # checkpoints every 2 steps: 2, 4, 6, 8


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """An uninterrupted 8-step run, and a run stopped at step 6 (to damage copies of)."""
    root = tmp_path_factory.mktemp("reference")
    module = ToyTokenModule(**MODULE_KW)
    full = fit(module, trainer(root / "full", STEPS, keep_last_k=3))
    fit(ToyTokenModule(**MODULE_KW), trainer(root / "stopped", 6, keep_last_k=3))
    return {"weights": weights(module), "result": full, "stopped": root / "stopped"}


def _damage(path: Path, how: str) -> None:
    """Damage a checkpoint's largest data file: one byte of tensor data flipped (the file
    still parses), cut in half, or garbage."""
    if how == "tensor bytes":
        flip_a_byte(path)
    elif how == "truncated":
        truncate(path)
    else:
        shard_file(path).write_bytes(b"garbage" * 100)


@pytest.mark.parametrize("how", ["tensor bytes", "truncated", "garbage"])
def test_auto_resume_skips_a_damaged_newest_checkpoint(tmp_path, reference, how) -> None:
    shutil.copytree(reference["stopped"], tmp_path, dirs_exist_ok=True)
    damaged = tmp_path / "ckpt" / "step-00000006.ckpt"
    _damage(damaged, how)
    module = ToyTokenModule(**MODULE_KW)
    loaded = count_loads(module)
    with pytest.warns(UserWarning, match=f"checkpoint {damaged} is damaged") as record:
        result = fit(module, trainer(tmp_path, STEPS, keep_last_k=3, resume="auto"))
    assert not any("weights_only" in str(w.message) for w in record)
    # it fell back to step 4 and trained on: the run is the uninterrupted one, bit for bit
    assert loaded.calls == (STEPS - 4) * 4  # 4 samples a step (a fresh run ends the same)
    assert_same_weights(weights(module), reference["weights"])
    assert losses(result) == losses(reference["result"])
    assert max(v.abs().max() for v in weights(module).values()) < 1e30  # no 3.4e38 rows


def test_explicit_damaged_or_foreign_checkpoint_fails_naming_it(tmp_path, reference) -> None:
    damaged = tmp_path / "stopped" / "ckpt" / "step-00000006.ckpt"
    shutil.copytree(reference["stopped"], tmp_path / "stopped")
    flip_a_byte(damaged)
    with pytest.raises(DamagedCheckpointError, match=f"{damaged} is damaged: its file .* does not"):
        fit(ToyTokenModule(**MODULE_KW), trainer(tmp_path / "a", STEPS, resume=str(damaged)))
    # a zip torch cannot unpickle safely (no checksum to compare outside a run's directory)
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"model": {}, "opaque": zipfile.ZipInfo("x")}, foreign)
    with pytest.raises(DamagedCheckpointError, match=str(foreign)) as error:
        fit(ToyTokenModule(**MODULE_KW), trainer(tmp_path / "b", STEPS, resume=str(foreign)))
    assert "weights_only" not in str(error.value)


def test_explicit_resume_of_a_directory_says_so_and_what_to_pass(tmp_path, reference) -> None:
    """``trainer.resume=<a directory>`` says it is a directory and names the checkpoint to
    pass, rather than calling the checkpoint damaged."""
    shutil.copytree(reference["stopped"], tmp_path / "stopped")
    ckpt = tmp_path / "stopped" / "ckpt"
    newest = ckpt / "step-00000006.ckpt"  # the newest run.json records
    said = (
        f"checkpoint {ckpt} is a directory, not a checkpoint: pass one of its checkpoints "
        f"(newest: {newest}); to resume a run from its newest intact checkpoint, "
        f"trainer.resume=auto with trainer.checkpoint_dir={ckpt}"
    )
    with pytest.raises(IsADirectoryError, match=re.escape(said)):
        fit(ToyTokenModule(**MODULE_KW), trainer(tmp_path / "a", STEPS, resume=str(ckpt)))
    with pytest.raises(IsADirectoryError, match=re.escape(said)):
        read_checkpoint_meta(ckpt)  # what kiln-train reads before the run starts
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(IsADirectoryError, match=f"{empty} is a directory.*holds no checkpoint"):
        fit(ToyTokenModule(**MODULE_KW), trainer(tmp_path / "b", STEPS, resume=str(empty)))


def test_a_fresh_run_refuses_a_directory_of_another_run(tmp_path, reference) -> None:
    shutil.copytree(reference["stopped"], tmp_path, dirs_exist_ok=True)
    ckpt = tmp_path / "ckpt"

    def contents() -> dict[str, bytes]:
        return {str(p.relative_to(ckpt)): p.read_bytes() for p in ckpt.rglob("*") if p.is_file()}

    before = contents()
    with pytest.raises(
        CheckpointDirError, match=f"{ckpt}.*resume='auto'.*new trainer.checkpoint_dir"
    ):
        fit(ToyTokenModule(**MODULE_KW), trainer(tmp_path, STEPS, keep_last_k=1))
    assert contents() == before  # nothing touched


def test_resume_keeps_the_run_id_and_prunes_only_its_own_files(tmp_path, reference) -> None:
    shutil.copytree(reference["stopped"], tmp_path, dirs_exist_ok=True)
    ckpt = tmp_path / "ckpt"
    run_id = json.loads((ckpt / "run.json").read_text())["run_id"]
    meta = read_checkpoint_meta(ckpt / "step-00000006.ckpt")
    assert [row["step"] for row in meta.pop("history")] == list(range(1, 7))
    meta.pop("validation_history")
    assert meta == {
        "config": None,
        "global_step": 6,
        "epoch": 1,
        "world_size": 1,
        "run_id": run_id,
        "threads_per_rank": default_threads_per_rank(1, 1),  # what fit computed with
    }
    foreign = ckpt / "step-00000001.ckpt"  # e.g. copied in by hand: no file of this run
    shutil.copytree(ckpt / "step-00000002.ckpt", foreign)
    module = ToyTokenModule(**MODULE_KW)
    loaded = count_loads(module)
    result = fit(module, trainer(tmp_path, STEPS, keep_last_k=1, resume="auto"))
    assert loaded.calls == (STEPS - 6) * 4  # resumed from step 6, 4 samples a step
    assert result.run_id == run_id
    assert sorted(p.name for p in ckpt.glob("*.ckpt")) == [
        "step-00000001.ckpt",
        "step-00000008.ckpt",
    ]
    assert list(json.loads((ckpt / "run.json").read_text())["checkpoints"]) == [
        "step-00000008.ckpt"
    ]


def test_an_unwritable_checkpoint_dir_fails_before_training(tmp_path) -> None:
    (tmp_path / "file").write_text("not a directory")
    module = ToyTokenModule(**MODULE_KW)
    before = weights(module)
    bad = tmp_path / "file" / "ckpt"
    with pytest.raises(CheckpointDirError, match=f"checkpoint_dir='{bad}' is not writable"):
        fit(module, trainer(tmp_path, STEPS, checkpoint_dir=str(bad)))
    assert_same_weights(weights(module), before)  # not one step was trained


class Overflowing(ToyTokenModule):
    """A finite loss whose update overflows float32: loss x 1e6 at a learning rate of 1e38."""

    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        return {**out, "loss": out["loss"] * 1e6}


def test_non_finite_weights_never_reach_a_checkpoint(tmp_path) -> None:
    # the step-1 loss (computed before the update) is finite; the update is not
    module = Overflowing(**{**MODULE_KW, "lr": 1e38})
    with pytest.raises(NonFiniteWeightsError, match="after step 1") as error:
        fit(module, trainer(tmp_path, STEPS, checkpoint_every_n_steps=1))
    assert isinstance(error.value, NonFiniteLossError)
    assert error.value.kiln_result.history[0]["train/loss"] < 1e8  # a finite first loss
    assert not list((tmp_path / "ckpt").glob("step-*"))
    assert not all(torch.isfinite(v).all() for v in weights(module).values())


class _OneRank:
    world_size = 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_finite_weights_check_counts_exactly_and_lets_an_overflowing_sum_pass(dtype):
    """Finite weights whose sum overflows (half-precision weights near its largest value)
    pass; a NaN or an inf anywhere fails with the exact count."""
    from kiln.core.errors import check_finite_weights

    big = torch.nn.Linear(64, 64, dtype=dtype)
    with torch.no_grad():
        big.weight.fill_(torch.finfo(dtype).max / 2)  # finite, and 4096 of them overflow
        big.bias.fill_(1.0)
    assert not torch.isfinite(big.weight.sum())
    check_finite_weights(_OneRank(), big, step=3)
    with torch.no_grad():
        big.weight[0, :3] = float("nan")
        big.bias[5] = float("inf")
    with pytest.raises(NonFiniteWeightsError, match=r"^4 model weights .* after step 3"):
        check_finite_weights(_OneRank(), big, step=3)


def test_resuming_on_another_world_size_fails_naming_both(tmp_path, reference) -> None:
    other = tmp_path / "two-ranks.ckpt"
    shutil.copytree(reference["stopped"] / "ckpt" / "step-00000006.ckpt", other)
    saved = torch.load(other / "meta.pt", weights_only=True)
    saved["world"]["world_size"] = 2
    torch.save(saved, other / "meta.pt")
    write_checksums(other)  # a checkpoint that says so, not a damaged one
    assert read_checkpoint_meta(other)["world_size"] == 2
    with pytest.raises(ValueError, match=f"{other} was written by a run on 2 processes.* has 1"):
        fit(ToyTokenModule(**MODULE_KW), trainer(tmp_path, STEPS, resume=str(other)))


@pytest.mark.timeout(120)  # a loop that restarts the same empty epoch would never end
def test_resuming_past_the_end_of_a_shorter_epoch_fails_at_once(tmp_path, reference) -> None:
    # step 4 stands at micro-batch 8 of a 12-batch epoch; with batches of 4 an epoch has 6
    ckpt = reference["stopped"] / "ckpt" / "step-00000004.ckpt"
    module = ToyTokenModule(**{**MODULE_KW, "batch_size": 4})
    with pytest.raises(
        EmptyEpochError, match=r"epoch 0 yields no micro-batch .*\(batch 8 of an epoch of 6\)"
    ):
        fit(module, trainer(tmp_path, STEPS, resume=str(ckpt)))


def test_a_lost_run_json_is_refused_when_its_checkpoints_name_two_runs(tmp_path, reference) -> None:
    shutil.copytree(reference["stopped"], tmp_path, dirs_exist_ok=True)
    ckpt = tmp_path / "ckpt"
    (ckpt / "run.json").unlink()
    other = reference["stopped"].parent / "full" / "ckpt" / "step-00000008.ckpt"
    shutil.copytree(other, ckpt / "step-00000008.ckpt")  # another run's checkpoint
    with pytest.raises(CheckpointDirError, match=r"run.json is missing .* they name runs"):
        fit(ToyTokenModule(**MODULE_KW), trainer(tmp_path, STEPS + 2, resume="auto"))
    assert not (ckpt / "run.json").exists()  # nothing guessed


def test_a_run_from_another_directorys_checkpoint_gets_its_own_id(tmp_path, reference) -> None:
    source = reference["stopped"] / "ckpt" / "step-00000006.ckpt"
    theirs = json.loads((source.parent / "run.json").read_text())["run_id"]
    result = fit(ToyTokenModule(**MODULE_KW), trainer(tmp_path, STEPS, resume=str(source)))
    ours = json.loads((tmp_path / "ckpt" / "run.json").read_text())
    assert result.run_id == ours["run_id"] != theirs
    assert ours["started_from"] == {"path": str(source), "run_id": theirs, "global_step": 6}
