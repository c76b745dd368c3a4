"""Helpers for the kiln-train tests: compose configs, run the entry point, read its outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from kiln.experiments.config import config_dir
from kiln.experiments.train.schema import register_configs

# Tiny, fast and deterministic: every test run trains the tiny BERT for a few steps.
FAST = ["debug=fast", "trainer.max_steps=4", "compile.backend=aot_eager"]


def compose_train(overrides: list[str], hydra_config: bool = False) -> DictConfig:
    """``configs/train.yaml`` composed with ``overrides`` (as ``kiln-train`` would)."""
    register_configs()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return compose("train", overrides=overrides, return_hydra_config=hydra_config)


def user_env() -> dict[str, str]:
    """This process's environment as a user's shell would hand it to kiln-train: without
    ``WANDB_SERVICE``, which W&B sets here once a test opened a run in-process (a child that
    inherits it shares this process's W&B service, and a killed child's run stays in use)."""
    return {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}


def run_train(
    args: list[str],
    log_dir: Path,
    timeout: float = 600,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run ``kiln-train`` in a fresh interpreter with its outputs below ``log_dir``
    (``env``: extra environment variables, e.g. a ``PYTHONPATH`` holding a plugin)."""
    env = {**user_env(), **(env or {}), "KILN_LOG_DIR": str(log_dir), "WANDB_MODE": "offline"}
    cmd = [sys.executable, "-m", "kiln.experiments.train", *args]
    return subprocess.run(
        cmd, env=env, cwd=cwd or log_dir, capture_output=True, text=True, timeout=timeout
    )


def job_dirs(log_dir: Path) -> list[Path]:
    """The job directories of the single sweep (or single run) below ``log_dir``."""
    sweeps = sorted((log_dir / "multirun").glob("*")) or sorted((log_dir / "runs").glob("*"))
    assert len(sweeps) == 1, sweeps
    if (sweeps[0] / ".hydra").is_dir():
        return [sweeps[0]]
    return sorted(
        (p for p in sweeps[0].iterdir() if (p / ".hydra").is_dir()), key=lambda p: int(p.name)
    )


def summary(job_dir: Path) -> dict[str, Any]:
    return json.loads((job_dir / "summary.json").read_text())


def explain(proc: subprocess.CompletedProcess) -> str:
    out, err = proc.stdout[-4000:], proc.stderr[-6000:]
    return f"exit {proc.returncode}\n--- stdout\n{out}\n--- stderr\n{err}"
