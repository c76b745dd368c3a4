"""With ``trainer.async_checkpoint``, the loop's periodic checkpoints are written, fsynced,
renamed and recorded in a thread while training goes on: the run does not wait for the disk,
yet each checkpoint is in place (and recorded) before the next save, when ``fit`` returns,
and when an error leaves it; a sync that fails there fails the run naming the file, with the
earlier checkpoints intact."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest
import torch
from toy import ToyTokenModule
from trainers import trainer_config

import kiln.core.checkpoints.save as checkpoint_module
from kiln.core import fit
from kiln.core.checkpoints.lookup import damage
from kiln.core.checkpoints.rundir import CheckpointWriteError, read_run_file

MODULE_KW = dict(n=24, batch_size=2, shuffle=True, dropout=0.2, momentum=0.9)


def trainer(tmp: Path, max_steps: int = 6, **kw):
    return trainer_config(
        max_steps=max_steps,
        checkpoint_dir=str(tmp / "ckpt"),
        checkpoint_every_n_steps=2,
        keep_last_k=3,
        seed=3,
        async_checkpoint=True,
        **kw,
    )


class StepProbe:
    """A callback that sees step 3 compute (its backward: the run stands at step 2)."""

    def __init__(self) -> None:
        self.moved_on = threading.Event()
        self.handle = None

    def on_loop_start(self, handle) -> None:
        self.handle = handle

    def on_before_backward(self, *args, **kwargs) -> None:
        if self.handle.global_step >= 2:  # the step after checkpoint 2 is training
            self.moved_on.set()


def test_training_goes_on_while_a_checkpoint_is_written_and_fit_returns_it_in_place(
    tmp_path, monkeypatch
):
    probe = StepProbe()
    sync = checkpoint_module.fsync_path
    overlapped: list[bool] = []

    def slow_sync(path):
        if path.name.startswith("step-00000002"):
            # a synchronous save would wait here for ever: the next step cannot start
            overlapped.append(probe.moved_on.wait(timeout=30))
        sync(path)

    monkeypatch.setattr(checkpoint_module, "fsync_path", slow_sync)
    result = fit(ToyTokenModule(**MODULE_KW), trainer(tmp_path), callbacks=[probe])
    assert overlapped == [True]
    ckpt = tmp_path / "ckpt"
    # when fit returns, its last checkpoint is in place and recorded, nothing half-written
    assert result.checkpoint == str(ckpt / "step-00000006.ckpt")
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "run.json",
        "step-00000002.ckpt",
        "step-00000004.ckpt",
        "step-00000006.ckpt",
    ]
    recorded = read_run_file(ckpt)
    assert recorded is not None and list(recorded.checkpoints) == [
        "step-00000002.ckpt",
        "step-00000004.ckpt",
        "step-00000006.ckpt",
    ]
    for name in recorded.checkpoints:
        assert damage(ckpt / name) is None  # whole, and the bytes its checksum says
    saved = torch.load(ckpt / "step-00000002.ckpt" / "meta.pt", weights_only=True)
    assert saved["loop"]["global_step"] == 2  # the state of step 2, not of a later step


def test_a_sync_that_fails_in_the_background_fails_the_run_naming_it(tmp_path, monkeypatch):
    sync = checkpoint_module.fsync_path

    def failing_disk(path):
        if path.name.startswith("step-00000004"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))  # the disk lost the write
        sync(path)

    monkeypatch.setattr(checkpoint_module, "fsync_path", failing_disk)
    with pytest.raises(CheckpointWriteError) as caught:
        fit(ToyTokenModule(**MODULE_KW), trainer(tmp_path))
    ckpt = tmp_path / "ckpt"
    message = str(caught.value)
    assert f"could not write checkpoint {ckpt / 'step-00000004.ckpt'} (Input/output" in message
    assert "no partial checkpoint is left and the earlier checkpoints are intact" in message
    assert sorted(p.name for p in ckpt.iterdir()) == ["run.json", "step-00000002.ckpt"]
    assert damage(ckpt / "step-00000002.ckpt") is None
    # what the failed run reports as its newest checkpoint is one that exists
    assert caught.value.kiln_result.checkpoint == str(ckpt / "step-00000002.ckpt")  # type: ignore[attr-defined]


def test_an_error_after_a_save_leaves_that_checkpoint_in_place(tmp_path, monkeypatch):
    """A run that fails while its checkpoint is still being written (here: the next step
    raises) still ends that write: the checkpoint is on disk, recorded, and reported."""

    class FailsAtStep3:
        def on_loop_start(self, handle) -> None:
            self.handle = handle

        def on_before_backward(self, *args, **kwargs) -> None:
            if self.handle.global_step == 2:
                raise RuntimeError("step 3 fails")

    sync = checkpoint_module.fsync_path
    release = threading.Event()

    def held_sync(path):
        release.wait(timeout=2)  # still syncing when step 3 fails
        sync(path)

    monkeypatch.setattr(checkpoint_module, "fsync_path", held_sync)
    with pytest.raises(RuntimeError, match="step 3 fails") as caught:
        fit(ToyTokenModule(**MODULE_KW), trainer(tmp_path), callbacks=[FailsAtStep3()])
    ckpt = tmp_path / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir()) == ["run.json", "step-00000002.ckpt"]
    assert damage(ckpt / "step-00000002.ckpt") is None
    assert caught.value.kiln_result.checkpoint == str(ckpt / "step-00000002.ckpt")  # type: ignore[attr-defined]
