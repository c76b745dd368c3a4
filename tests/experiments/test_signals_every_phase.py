"""SIGTERM and Ctrl-C stop ``kiln-train`` within seconds in every phase of a job, with a
record that says it stopped and where: setup, a shuffle buffer's fill (no step boundary
would ever come), the first step (compilation), validation, and the job's end.

Each job is a real process; the signal goes when the phase's line appears in its output (a
slow phase is made slow for real: a large buffer, many validation batches, or a pause).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from in_process import user_env
from train_helpers import FAST, wait_until, write_tiny_corpus

HERE = Path(__file__).resolve().parent
STREAM = [*FAST, "model=llama-tiny-lm", "data=lm_corpus", "data.streaming=true",
          "data.max_length=64", "data.batch_size=2", "data.max_val_samples=2"]  # fmt: skip
# a buffer that fits in memory but takes minutes to fill from the tiny corpus
LONG_FILL = "data.shuffle_buffer=200000"
STOPS_WITHIN_S = 60  # the stop itself takes seconds; this only bounds a broken one


class Pause:
    """A callback that prints ``pausing in <at>`` and sleeps there (a slow phase, for real):
    ``at`` is ``init`` (built in the job's train stage, before ``fit``) or a callback point."""

    def __init__(self, at: str = "init", seconds: float = 120.0) -> None:
        self.at, self.seconds = at, seconds
        if at == "init":
            self._pause()

    def _pause(self) -> None:
        os.write(2, f"pausing in {self.at}\n".encode())  # past any console capture
        time.sleep(self.seconds)

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        if self.at == "first_step":
            self._pause()
            self.at = "done"


def _pause(at: str) -> list[str]:
    target = f"{Path(__file__).stem}.Pause"
    return [f"+callbacks.pause._target_={target}", f"+callbacks.pause.at={at}"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"))


def stop_when(
    args: list[str], ready: str | Path, signum: int, tmp_path: Path
) -> tuple[int, dict[str, Any], str]:
    """Start ``kiln-train args``; once ``ready`` (a line in its output, or a file) is there,
    send ``signum``. Returns its exit status, its ``summary.json`` and its output."""
    job_dir = tmp_path / "job"
    path = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    env = {**user_env(), "KILN_LOG_DIR": str(tmp_path), "WANDB_MODE": "offline", "PYTHONPATH": path}
    cmd = [sys.executable, "-m", "kiln.experiments.train", *args, f"hydra.run.dir={job_dir}"]
    out = tmp_path / "out.log"
    with out.open("w") as f:
        # a terminal's shell gives its job the default SIGINT action (a background one ignores it)
        default_sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
        proc = subprocess.Popen(
            cmd, env=env, cwd=tmp_path, stdout=f, stderr=f, preexec_fn=default_sigint
        )
    try:
        if isinstance(ready, Path):
            wait_until(proc, out, lambda _: ready.exists())
        else:
            wait_until(proc, out, lambda text: ready in text)
        proc.send_signal(signum)
        proc.wait(timeout=STOPS_WITHIN_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.read_text()
    record = json.loads((job_dir / "summary.json").read_text())
    return proc.returncode, record, text


EXIT = {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGINT: -signal.SIGINT}


def assert_stopped(code: int, record: dict, text: str, signum: int, where: str, step: int):
    assert code == EXIT[signum], text[-4000:]
    name = signal.Signals(signum).name
    assert (record["status"], record["stop_signal"]) == ("stopped", name), text[-4000:]
    assert record["stopped_in"] == where
    assert record["global_step"] == step
    assert record["attempts"][-1]["ended"] == name


@pytest.mark.process
@pytest.mark.parametrize(
    ("signum", "workers"),
    [(signal.SIGTERM, 0), (signal.SIGINT, 1)],
    ids=["SIGTERM", "SIGINT-worker"],
)
def test_a_stop_while_the_shuffle_buffer_fills(corpus, tmp_path, signum, workers) -> None:
    args = [*STREAM, LONG_FILL, f"data.num_workers={workers}", f"paths.corpus_dir={corpus}"]
    code, record, text = stop_when(args, "filling a shuffle buffer", signum, tmp_path)
    assert_stopped(code, record, text, signum, "train: the first batch", 0)
    assert f"{signal.Signals(signum).name} during the first batch: stopping now" in text


@pytest.mark.process
def test_a_stop_in_the_first_step_compiling(tmp_path) -> None:
    code, record, text = stop_when(
        [*FAST, *_pause("first_step")], "pausing in first_step", signal.SIGTERM, tmp_path
    )
    assert_stopped(code, record, text, signal.SIGTERM, "train: the first step", 0)


@pytest.mark.process
def test_a_stop_during_validation(tmp_path) -> None:
    # many one-row validation batches at step 2 (seconds), and none elsewhere
    args = [*FAST, "trainer.val_every_n_steps=2", "trainer.limit_val_batches=null",
            "data.num_val=3000", "data.val_batch_size=1"]  # fmt: skip
    code, record, text = stop_when(args, "step 2/4", signal.SIGTERM, tmp_path)
    # the validation ends at its next batch; the run stops at its step, as docs/checkpoints.md
    # ("Signals") promises: with a checkpoint there, so the step's training is kept
    assert code == EXIT[signal.SIGTERM], text[-4000:]
    assert (record["status"], record["stop_signal"]) == ("stopped", "SIGTERM"), text[-4000:]
    assert record["global_step"] == 2 and record["attempts"][-1]["ended"] == "SIGTERM"
    assert "stopping at the next batch of validation at step 2" in text
    assert "validation at step 2 stopped before its end" in text
    checkpoints = sorted(p.name for p in (tmp_path / "job" / "checkpoints").glob("step-*"))
    assert checkpoints == ["step-00000002.ckpt"], text[-4000:]
    assert record["validation_history"] == []  # no half validation's metrics


@pytest.mark.process
def test_a_stop_before_fit(tmp_path) -> None:
    code, record, text = stop_when([*FAST, *_pause("init")], "pausing in init", signal.SIGTERM,
                                   tmp_path)  # fmt: skip
    assert_stopped(code, record, text, signal.SIGTERM, "train", 0)


@pytest.mark.process
def test_a_stop_as_the_job_ends_keeps_its_finished_record(tmp_path) -> None:
    """The record is written whole before the stop acts: the job trained to its end."""
    ready = tmp_path / "job" / "summary.json"
    code, record, text = stop_when(FAST, ready, signal.SIGTERM, tmp_path)
    assert code in (0, 143), text[-4000:]  # 0: it had ended by the time the signal came
    assert (record["status"], record["global_step"]) == ("ok", 4), text[-4000:]


@pytest.mark.process
def test_a_stop_in_the_second_job_of_a_sweep_ends_the_process(tmp_path) -> None:
    """``kiln-train -m`` (jobs one after another in the process): SIGTERM while the second
    job trains stops it at a step boundary, and the process ends (the first job's W&B run,
    service and threads keep nothing alive)."""
    sweep = tmp_path / "sweep"
    env = {**user_env(), "KILN_LOG_DIR": str(tmp_path), "WANDB_MODE": "offline"}
    args = ["-m", *FAST, "trainer.max_steps=2,400", "trainer.checkpoint_every_n_steps=2",
            f"hydra.sweep.dir={sweep}"]  # fmt: skip
    out = tmp_path / "out.log"
    with out.open("w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "kiln.experiments.train", *args],
                                env=env, cwd=tmp_path, stdout=f, stderr=f)  # fmt: skip
    try:
        wait_until(proc, out, lambda _: any((sweep / "1" / "checkpoints").glob("step-*")))
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=STOPS_WITHIN_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, out.read_text()[-4000:]
    first, second = (json.loads((sweep / n / "summary.json").read_text()) for n in "01")
    assert (first["status"], second["status"]) == ("ok", "stopped")
    assert second["stop_signal"] == "SIGTERM"
