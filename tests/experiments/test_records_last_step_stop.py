"""A job stopped by a signal at its last step (``summary.json``: ``stopped`` at
``trainer.max_steps``, with its checkpoint there; under SLURM a preemption there requeues it)
and run again trains nothing and ends ``ok``: its record still names that checkpoint."""

from __future__ import annotations

import json

import pytest
from train_helpers import FAST, explain, run_train, summary


@pytest.mark.long  # two runs, 12 s on 2 cores: a further case of resuming a job
def test_a_rerun_with_no_step_left_keeps_the_checkpoint_it_resumed_from(tmp_path):
    job_dir = tmp_path / "job"
    args = [*FAST, "trainer.max_steps=2", f"hydra.run.dir={job_dir}"]
    proc = run_train(args, tmp_path)
    assert proc.returncode == 0, explain(proc)
    record = summary(job_dir)
    assert record["checkpoint"] == "checkpoints/step-00000002.ckpt", record["checkpoint"]
    # what a SIGTERM taken at the last step leaves (the stop checkpoint is that step's)
    record.update(status="stopped", stop_reason="signal", stop_signal="SIGTERM")
    (job_dir / "summary.json").write_text(json.dumps(record))

    proc = run_train(args, tmp_path)
    assert proc.returncode == 0, explain(proc)
    again = summary(job_dir)
    assert (again["status"], again["global_step"]) == ("ok", 2), explain(proc)
    assert again["checkpoint"] == "checkpoints/step-00000002.ckpt", explain(proc)
