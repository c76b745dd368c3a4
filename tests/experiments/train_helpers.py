"""Helpers for the kiln-train tests: compose configs, run the entry point, read its outputs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from in_process import kiln_command, user_env  # noqa: F401 (user_env: for the tests)
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


def run_train(
    args: list[str],
    log_dir: Path,
    timeout: float = 600,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    process: bool = False,
) -> subprocess.CompletedProcess:
    """``kiln-train args`` with its outputs below ``log_dir``, run from ``cwd`` (default
    ``log_dir``): in this process, or with ``process=True`` in a fresh interpreter
    (``env``: extra environment variables; see :func:`in_process.kiln_command`)."""
    env = {**(env or {}), "KILN_LOG_DIR": str(log_dir), "WANDB_MODE": "offline"}
    return kiln_command("train", args, env, cwd or log_dir, process, timeout)


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
