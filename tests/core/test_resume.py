"""Exact resume: stopped at step N (cleanly or by SIGKILL) and resumed to 2N, a run ends with
the weights and logged losses of an uninterrupted 2N run, bit for bit (fp32, CPU)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from toy import ToyTokenModule, weights

from kiln.core import TrainerConfig, fit

HERE = Path(__file__).parent
# Shuffled data, dropout, momentum and a step schedule: every piece of state must come back.
MODULE_KW = dict(n=24, batch_size=2, shuffle=True, dropout=0.2, scheduler=True, momentum=0.9)


def trainer(tmp: Path, max_steps: int, **kw) -> TrainerConfig:
    return TrainerConfig(
        accelerator="cpu",
        precision="32-true",
        deterministic=True,
        progress=False,
        log_every_n_steps=1,
        max_steps=max_steps,
        accumulate_grad_batches=2,
        checkpoint_dir=str(tmp / "ckpt"),
        checkpoint_every_n_steps=2,
        keep_last_k=2,
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
    second = fit(resumed_module, trainer(tmp_path / "split", 8, resume="auto"))

    assert second.global_step == 8
    assert_same_weights(weights(resumed_module), weights(full_module))
    assert losses(second) == losses(full)  # history carries over through the checkpoint
    assert second.metrics == full.metrics


def test_resume_after_sigkill_is_bit_identical(tmp_path: Path) -> None:
    steps = 12
    full_module = ToyTokenModule(**MODULE_KW)
    full = fit(full_module, trainer(tmp_path / "full", steps))

    ckpt_dir = tmp_path / "killed" / "ckpt"
    env = {**os.environ, "KILN_TEST_STEP_SLEEP": "0.15", "PYTHONPATH": str(HERE)}
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "resume_worker.py"), str(tmp_path / "killed"), str(steps)],
        env=env,
    )
    try:
        deadline = time.monotonic() + 120
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
    resumed = fit(resumed_module, trainer(tmp_path / "killed", steps, resume="auto"))
    assert resumed.global_step == steps
    assert_same_weights(weights(resumed_module), weights(full_module))
    assert losses(resumed) == losses(full)


def test_resume_auto_without_checkpoint_starts_fresh(tmp_path: Path) -> None:
    result = fit(ToyTokenModule(**MODULE_KW), trainer(tmp_path, 2, resume="auto"))
    assert result.global_step == 2


def test_resume_from_missing_file_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such checkpoint"):
        fit(ToyTokenModule(**MODULE_KW), trainer(tmp_path, 2, resume=str(tmp_path / "nope.ckpt")))
