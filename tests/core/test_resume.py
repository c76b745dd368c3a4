"""Exact resume: stopped at step N (cleanly or by SIGKILL) and resumed to 2N, a run ends with
the weights and logged losses of an uninterrupted 2N run, bit for bit (fp32, CPU)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from lightning.fabric.loggers import Logger
from toy import ToyTokenModule, count_loads, weights
from trainers import trainer_config

from kiln.core import TrainerConfig, fit, launch

HERE = Path(__file__).parent
# a worker script imports the toy and this module (here) and the tests' trainers (tests/)
WORKER_PATH = os.pathsep.join([str(HERE), str(HERE.parent)])
# Shuffled data, dropout, momentum and a step schedule: every piece of state must come back.
MODULE_KW = dict(n=24, batch_size=2, shuffle=True, dropout=0.2, scheduler=True, momentum=0.9)


def trainer(tmp: Path, max_steps: int, **kw) -> TrainerConfig:
    kw = {
        "checkpoint_dir": str(tmp / "ckpt"),
        "keep_last_k": 2,
        "checkpoint_every_n_steps": 2,
        **kw,
    }
    return trainer_config(
        precision="32-true",
        deterministic=True,
        max_steps=max_steps,
        accumulate_grad_batches=2,
        seed=7,
        **kw,
    )


def losses(result) -> list[tuple[int, float]]:
    return [(row["step"], row["train/loss"]) for row in result.history]


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_resume_after_clean_stop_is_bit_identical(tmp_path: Path) -> None:
    # 24 samples / 2 per batch / 2 per window = 6 steps per epoch: 8 steps cross an epoch.
    full_module = ToyTokenModule(**MODULE_KW)
    full = fit(full_module, trainer(tmp_path / "full", 8))

    first = fit(ToyTokenModule(**MODULE_KW), trainer(tmp_path / "split", 4))
    assert first.global_step == 4
    resumed_module = ToyTokenModule(**MODULE_KW)
    loaded = count_loads(resumed_module)
    second = fit(resumed_module, trainer(tmp_path / "split", 8, resume="auto"))

    assert second.global_step == 8
    # a fresh run of 8 steps ends the same way: only steps 5-8 (4 samples each) were trained
    assert loaded.calls == 4 * 4
    assert_same_weights(weights(resumed_module), weights(full_module))
    assert losses(second) == losses(full)  # history carries over through the checkpoint
    assert second.metrics == full.metrics


# a killed worker process: the clean stop and copied-checkpoint resumes prove it in make test
@pytest.mark.long
def test_resume_after_sigkill_is_bit_identical(tmp_path: Path, capsys) -> None:
    steps = 12
    full_module = ToyTokenModule(**MODULE_KW)
    full = fit(full_module, trainer(tmp_path / "full", steps))

    ckpt_dir = tmp_path / "killed" / "ckpt"
    env = {**os.environ, "KILN_TEST_STEP_SLEEP": "0.15", "PYTHONPATH": WORKER_PATH}
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "resume_worker.py"), str(tmp_path / "killed"), str(steps)],
        env=env,
    )
    try:
        deadline = time.monotonic() + 600  # a loaded machine starts slowly
        while not list(ckpt_dir.glob("step-*.ckpt")):
            assert proc.poll() is None, "the worker ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.05)
        time.sleep(0.4)  # let it get into the middle of a later step
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert not (ckpt_dir / f"step-{steps:08d}.ckpt").exists(), "the kill came too late"

    resumed_module = ToyTokenModule(**MODULE_KW)
    loaded = count_loads(resumed_module)
    capsys.readouterr()
    resumed = fit(resumed_module, trainer(tmp_path / "killed", steps, resume="auto"))
    assert resumed.global_step == steps
    # it continued from the newest checkpoint the killed run wrote, training only what followed
    said = re.search(r"resumed from \S+ at step (\d+)", capsys.readouterr().out)
    assert said, "it did not say it resumed"
    start = int(said[1])
    assert 2 <= start < steps
    assert loaded.calls == 4 * (steps - start)
    assert_same_weights(weights(resumed_module), weights(full_module))
    assert losses(resumed) == losses(full)


def test_resume_auto_without_checkpoint_starts_fresh(tmp_path: Path) -> None:
    result = fit(ToyTokenModule(**MODULE_KW), trainer(tmp_path, 2, resume="auto"))
    assert result.global_step == 2


def test_resume_from_missing_file_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such checkpoint"):
        fit(ToyTokenModule(**MODULE_KW), trainer(tmp_path, 2, resume=str(tmp_path / "nope.ckpt")))


# -- any epoch, accumulation 3, kills at chosen points -----------------------------------
# 40 samples / 2 per batch = 20 micro-batches per epoch; windows of 3 -> 7 steps per epoch
# (the 7th holds 2): steps 1-7 are epoch 0, 8-14 epoch 1, 15-20 epoch 2.
EPOCHS_KW = dict(n=40, batch_size=2, shuffle=True, dropout=0.2, scheduler=True, momentum=0.9)
EPOCHS_STEPS = 20


def epochs_trainer(root: Path, resume: str | None, devices: int = 1) -> TrainerConfig:
    return trainer_config(
        devices=devices,
        precision="32-true",
        deterministic=True,
        max_steps=EPOCHS_STEPS,
        accumulate_grad_batches=3,
        checkpoint_dir=str(root / "ckpt"),
        checkpoint_every_n_steps=5,
        keep_last_k=10,
        val_every_n_steps=4,
        seed=7,
        resume=resume,
    )


class Killer(Logger):
    """SIGKILLs this process at a chosen point (a logger: it learns each logged step).

    ``train:S:J`` kills in micro-batch J of step S's window, ``val:S`` in the validation after
    step S, ``save:S`` halfway through writing step S's checkpoint (temp file half written).
    """

    def __init__(self, spec: str) -> None:
        super().__init__()
        kind, *numbers = spec.split(":")
        self.kind, self.numbers, self.last_step = kind, [int(x) for x in numbers], 0
        if kind == "save":
            self._kill_in_save(self.numbers[0])

    name = "killer"
    version = "0"

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        self.last_step = step or 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def training_step(self, batch_idx: int) -> None:
        if self.kind == "train" and self.numbers == [self.last_step + 1, batch_idx % 3]:
            os.kill(os.getpid(), signal.SIGKILL)

    def validation_step(self) -> None:
        if self.kind == "val" and self.numbers == [self.last_step]:
            os.kill(os.getpid(), signal.SIGKILL)

    @staticmethod
    def _kill_in_save(step: int) -> None:
        from checkpoint_files import truncate

        from kiln.core.checkpoints import save

        def cut_off(write):  # writes the staged directory a save renames into place
            def write_then_die(state, *, checkpoint_id, **kw):
                written = write(state, checkpoint_id=checkpoint_id, **kw)
                if f"step-{step:08d}" in Path(checkpoint_id).name:
                    if hasattr(written, "result"):  # an asynchronous save
                        written.result()
                    truncate(Path(checkpoint_id))  # the write is cut off here
                    os.kill(os.getpid(), signal.SIGKILL)
                return written

            return write_then_die

        # this worker process only, whichever way the run saves
        save.save, save.async_save = cut_off(save.save), cut_off(save.async_save)


class KillableToy(ToyTokenModule):
    def __init__(self, killer: Killer | None, **kw) -> None:
        super().__init__(**kw)
        self.killer = killer

    def training_step(self, batch, batch_idx):
        if self.killer is not None:
            self.killer.training_step(batch_idx)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        if self.killer is not None:
            self.killer.validation_step()
        return super().validation_step(batch, batch_idx)


def epochs_run(root: Path, resume: str | None, kill: str | None = None, devices: int = 1):
    """Train the epochs setup (killing itself at ``kill``); top-level for spawned ranks."""
    killer = Killer(kill) if kill else None
    module = KillableToy(killer, **EPOCHS_KW)
    result = fit(module, epochs_trainer(root, resume, devices), loggers=[killer] if killer else [])
    return {"weights": weights(module), "result": result, "module": module}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    """One uninterrupted 20-step run, shared by every resume below."""
    return epochs_run(tmp_path_factory.mktemp("uninterrupted"), None)


def _kill_worker(root: Path, kill: str, devices: int = 1) -> None:
    env = {**os.environ, "PYTHONPATH": WORKER_PATH}
    args = [sys.executable, str(HERE / "resume_worker.py"), str(root), kill, str(devices)]
    proc = subprocess.run(args, env=env, timeout=600, capture_output=True, text=True)
    if devices == 1:
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    else:  # the launcher reports its killed rank as a failure
        assert "Signals.SIGKILL" in proc.stderr or "SIGKILL" in proc.stderr, proc.stderr[-3000:]


def _assert_same_run(got: dict, want: dict) -> None:
    assert_same_weights(got["weights"], want["weights"])
    assert losses(got["result"]) == losses(want["result"])
    assert [r["step"] for r in got["result"].history] == list(range(1, EPOCHS_STEPS + 1))
    assert got["result"].metrics == want["result"].metrics


@pytest.mark.slow  # four worker processes (~7 min on a loaded 2-core machine)
def test_sigkills_in_epochs_0_1_2_mid_window_mid_save_mid_validation(tmp_path, uninterrupted):
    # one run killed four times, resumed with resume='auto' each time:
    # epoch 0 mid-window (step 6, micro-batch 2 of 3) -> resumes from step 5 (epoch 0)
    # during the write of step 10's checkpoint (epoch 1) -> resumes from step 5 again
    # during the validation after step 12 (epoch 1) -> resumes from step 10 (epoch 1, batch 9)
    # epoch 2 mid-window (step 19, micro-batch 1) -> resumes from step 15 (epoch 2, batch 3)
    for kill in ("train:6:2", "save:10", "val:12", "train:19:1"):
        _kill_worker(tmp_path, kill)
    assert not (tmp_path / "ckpt" / "step-00000020.ckpt").exists()
    _assert_same_run(epochs_run(tmp_path, "auto"), uninterrupted)


@pytest.mark.parametrize("step", [10, 15])
def test_resume_from_copied_checkpoint_in_epochs_1_and_2(tmp_path, uninterrupted, step) -> None:
    source = Path(uninterrupted["result"].checkpoint).parent / f"step-{step:08d}.ckpt"
    copy = tmp_path / "copy.ckpt"
    shutil.copytree(source, copy)
    module = KillableToy(None, **EPOCHS_KW)
    loaded = count_loads(module)
    result = fit(module, epochs_trainer(tmp_path, str(copy)))
    _assert_same_run({"weights": weights(module), "result": result}, uninterrupted)
    # the micro-batches trained before the checkpoint are skipped at the sampler: each
    # sample loaded after the resume is one the run trains on (2 per micro-batch)
    per_epoch, total = 20, 2 * 20 + 6 * 3  # step 20 ends the 6th window of epoch 2
    consumed = (step // 7) * per_epoch + (step % 7) * 3
    assert loaded.calls == 2 * (total - consumed)


@pytest.mark.slow
def test_sigkill_on_two_gloo_ranks_in_epoch_1_resumes_exactly(tmp_path) -> None:
    want = launch(epochs_run, 2, tmp_path / "full", None, None, 2)
    _kill_worker(tmp_path / "killed", "train:13:1", devices=2)  # resumes from step 10
    got = launch(epochs_run, 2, tmp_path / "killed", "auto", None, 2)
    for rank in range(2):
        _assert_same_run(got[rank], want[rank])
