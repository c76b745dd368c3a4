"""Validation rows a SIGKILLed attempt logged survive it: they are carried in the
checkpoints and in ``summary.json`` (``validation_history``), and a resumed job logs the
ones its W&B run lacks, so the run ends with every validation point exactly once."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from train_helpers import (
    FAST,
    checkpointed_steps,
    explain,
    run_train,
    start_train,
    summary,
    wait_until,
)

from kiln.experiments.tracking.wandb_files import read_history

STEPS = 40
ARGS = [
    *FAST,
    f"trainer.max_steps={STEPS}",
    "trainer.val_every_n_steps=4",
    "trainer.checkpoint_every_n_steps=4",
]
HEADER_BYTES = 7  # a .wandb file's ":W&B" header: all a killed attempt's file may hold


@pytest.mark.process
def test_a_sigkilled_attempts_validation_rows_end_in_the_wandb_run_once(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    proc, out = start_train(ARGS, job_dir, tmp_path, "killed")
    try:  # validations at 4, 8 and 12 are logged by now
        wait_until(proc, out, lambda _: max(checkpointed_steps(job_dir), default=0) >= 12)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    killed_at = max(checkpointed_steps(job_dir))
    assert killed_at < STEPS, "the run finished before the kill"
    # what the issue found: the killed W&B process wrote no row (made certain here, since
    # how much a killed W&B process flushed is a matter of timing)
    (killed_file,) = job_dir.glob("wandb/offline-run-*/run-*.wandb")
    killed_file.write_bytes(killed_file.read_bytes()[:HEADER_BYTES])

    resumed = run_train([*ARGS, f"hydra.run.dir={job_dir}"], tmp_path)
    assert resumed.returncode == 0, explain(resumed)
    record = summary(job_dir)
    assert record["attempts"][-1]["from_step"] == killed_at
    every = list(range(4, STEPS + 1, 4))
    assert [row["step"] for row in record["validation_history"]] == every
    assert record["validation_history"][-1] == {"step": STEPS, **record["metrics"]}
    rows = read_history(job_dir)  # every attempt's .wandb file, as one run
    validated = sorted(r["trainer/global_step"] for r in rows if "val/accuracy" in r)
    assert validated == every  # each once: none lost with the killed attempt, none twice
    trained = sorted(r["trainer/global_step"] for r in rows if "train/loss" in r)
    assert trained == list(range(1, STEPS + 1))
