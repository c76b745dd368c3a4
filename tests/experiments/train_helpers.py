"""Helpers for the kiln-train tests: compose configs, run the entry point, read its outputs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from in_process import kiln_command, user_env
from omegaconf import DictConfig

from kiln.experiments.settings.compose import config_dir
from kiln.experiments.train.train_config import register_configs

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
    if _is_job_dir(sweeps[0]):
        return [sweeps[0]]
    return sorted((p for p in sweeps[0].iterdir() if _is_job_dir(p)), key=lambda p: int(p.name))


def _is_job_dir(path: Path) -> bool:
    return any((path / name).exists() for name in (".hydra", "summary.json", "attempts.json"))


def summary(job_dir: Path) -> dict[str, Any]:
    return json.loads((job_dir / "summary.json").read_text())


def explain(proc: subprocess.CompletedProcess) -> str:
    out, err = proc.stdout[-4000:], proc.stderr[-6000:]
    return f"exit {proc.returncode}\n--- stdout\n{out}\n--- stderr\n{err}"


def refused_in_config(args: list[str], tmp_path: Path, *errors: str) -> tuple[dict, Path]:
    """``kiln-train args`` (with :data:`FAST`) into ``<tmp_path>/job`` ends in the config stage
    naming each of ``errors``, with no W&B run; returns its record and job directory."""
    job_dir = tmp_path / "job"
    proc = run_train([*FAST, *args, f"hydra.run.dir={job_dir}"], tmp_path)
    assert proc.returncode == 1, explain(proc)
    record = summary(job_dir)
    assert (record["status"], record["error_stage"]) == ("failed", "config"), record["error"]
    for error in errors:
        assert error in record["error"], record["error"]
    assert record["wandb"] is None and not (job_dir / "wandb").exists()
    return record, job_dir


def checkpointed_steps(job_dir: Path) -> list[int]:
    """The steps of the checkpoints ``<job dir>/checkpoints/run.json`` lists (none yet: [])."""
    run_file = job_dir / "checkpoints" / "run.json"
    try:
        names = json.loads(run_file.read_text())["checkpoints"]
    except (OSError, ValueError, KeyError):
        return []
    return [int(name.split("-")[1].split(".")[0]) for name in names]


def wait_until(proc: subprocess.Popen, out: Path, ready: Callable[[str], bool]) -> None:
    """Wait until ``ready(the output so far)``; fail if the job ends first or in 600 s."""
    deadline = time.monotonic() + 600
    while not ready(out.read_text()):
        assert proc.poll() is None, f"ended before the signal: {out.read_text()[-4000:]}"
        assert time.monotonic() < deadline, "not ready within 600 s"
        time.sleep(0.05)


def start_train(
    args: list[str], job_dir: Path, log_dir: Path, name: str, group: bool = False
) -> tuple[subprocess.Popen, Path]:
    """Start ``kiln-train args`` into ``job_dir`` in a fresh interpreter, as a user's shell
    would (in a new session if ``group``, for signals to its whole process group); returns
    the process and the file its output goes to (``<log_dir>/attempt-<name>.log``)."""
    env = {**user_env(), "KILN_LOG_DIR": str(log_dir), "WANDB_MODE": "offline"}
    cmd = [sys.executable, "-m", "kiln.experiments.train", *args, f"hydra.run.dir={job_dir}"]
    out = log_dir / f"attempt-{name}.log"
    with out.open("w") as f:
        proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=log_dir,
            stdout=f,
            stderr=f,
            start_new_session=group,
            # a terminal's shell gives its job the default SIGINT action; a background
            # shell (CI) ignores it, and the job would end as for SIGTERM (Terminated)
            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) if group else None,
        )
    return proc, out


def write_tiny_corpus(out: Path) -> Path:
    """A small corpus by ``scripts/make_corpus.py`` (the standard library's ``email`` sources,
    a 400-token BPE) in ``out``: what ``data=lm_corpus`` reads when ``KILN_CORPUS=out``."""
    import email

    scripts = str(Path(__file__).resolve().parents[2] / "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    import make_corpus  # pyright: ignore[reportMissingImports]

    make_corpus.main(
        ["--source", str(Path(email.__file__).parent), "--out", str(out), "--vocab-size", "400",
         "--docs-per-shard", "10", "--val-percent", "20"]
    )  # fmt: skip
    return out
