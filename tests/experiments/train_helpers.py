"""Helpers for the kiln-train tests: compose configs, run the entry point, read its outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from in_process import run_in_process
from omegaconf import DictConfig

import kiln.experiments.train as train_package
from kiln.experiments.config import config_dir
from kiln.experiments.train.schema import register_configs

# what ``python -m kiln.experiments.train`` has as ``sys.argv[0]``
TRAIN_MAIN = str(Path(train_package.__file__).parent / "__main__.py")

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
    process: bool = False,
) -> subprocess.CompletedProcess:
    """Run ``kiln-train args`` with its outputs below ``log_dir`` (``env``: extra environment
    variables): in this process, as the console script runs it but for the process, or with
    ``process=True`` in a fresh interpreter (``timeout`` applies to that one only).

    A ``PYTHONPATH`` in ``env`` (a plugin on the path) needs ``process=True``: this process
    would keep the plugin imported for every later test."""
    env = {**(env or {}), "KILN_LOG_DIR": str(log_dir), "WANDB_MODE": "offline"}
    if process:
        cmd = [sys.executable, "-m", "kiln.experiments.train", *args]
        return subprocess.run(
            cmd,
            env={**user_env(), **env},
            cwd=cwd or log_dir,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    assert "PYTHONPATH" not in env, "a plugin on PYTHONPATH: run_train(..., process=True)"
    from kiln.experiments.config import run_hydra_app
    from kiln.experiments.train.cli import task

    # cli.main() without fast_exit.end_process, which ends the process
    return run_in_process(
        lambda: run_hydra_app(task, "train", register_configs),
        [TRAIN_MAIN, *args],
        env,
        str(cwd or log_dir),
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
