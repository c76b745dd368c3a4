"""A ``kiln-train`` job re-run into its directory on another number of devices: the config
stage lets ``trainer.devices`` (and ``num_nodes``) change with ``accumulate_grad_batches``
when the global batch (processes x ``data.batch_size`` x accumulation) stays the same, and
refuses another global batch, naming both world sizes and the accumulation that keeps it."""

from __future__ import annotations

from pathlib import Path

import pytest
from train_helpers import FAST, explain, run_train, summary

from kiln.experiments.train.rerun import ResumeConfigError, check_resume, config_changes

CKPT = ["trainer.checkpoint_every_n_steps=2", "logger=csv"]


def cfg(devices: int, accumulate: int, batch: int = 8, **trainer) -> dict:
    return {
        "model": {"name": "m"},
        "data": {"batch_size": batch},
        "trainer": {"devices": devices, "num_nodes": 1, "accumulate_grad_batches": accumulate,
                    "seed": 0, **trainer},
    }  # fmt: skip


def test_the_same_global_batch_on_another_world_size_is_no_change():
    assert config_changes(cfg(2, 2), cfg(1, 4)) == []
    assert config_changes(cfg(2, 2), cfg(4, 1)) == []
    changed = config_changes(cfg(2, 2), cfg(1, 2))
    assert changed == ["trainer.devices: 2 -> 1"]


def test_another_global_batch_is_refused_naming_both_world_sizes_and_what_works(monkeypatch):
    path = Path("job/checkpoints/step-00000004.ckpt")
    monkeypatch.setattr(
        "kiln.experiments.train.rerun.explicit_checkpoint_meta",
        lambda resume: {"config": cfg(2, 2), "global_step": 4},
    )
    with pytest.raises(ResumeConfigError) as error:
        check_resume(cfg(1, 2, resume=str(path)))
    message = str(error.value)
    assert "trainer.devices: 2 -> 1" in message
    assert "written by a run on 2 processes, this job has 1" in message
    assert "2 x 8 x 2 = 32, this run's 1 x 8 x 2 = 16" in message
    assert "set trainer.accumulate_grad_batches=4 to keep it" in message
    # the fix leads, as kiln.core's own refusal does: before the general advice
    assert message.startswith(f"{path} was written by a run on 2 processes")
    assert message.index("accumulate_grad_batches=4") < message.index("Re-run with")
    assert check_resume(cfg(1, 4, resume=str(path))) == (4, path)  # the same global batch


@pytest.mark.process  # a 2-process job, then its resume on one process
def test_a_two_device_job_resumes_on_one_device(tmp_path):
    job_dir = tmp_path / "J"
    two = [*FAST, *CKPT, "trainer.devices=2", "trainer.accumulate_grad_batches=1"]
    proc = run_train([*two, f"hydra.run.dir={job_dir}"], tmp_path, timeout=900, process=True)
    assert proc.returncode == 0, explain(proc)
    one = [*FAST, *CKPT, "trainer.devices=1", "trainer.accumulate_grad_batches=2"]
    proc = run_train([*one, "trainer.max_steps=8", f"hydra.run.dir={job_dir}"], tmp_path)
    assert proc.returncode == 0, explain(proc)
    record = summary(job_dir)
    assert record["status"] == "ok" and record["global_step"] == 8
    assert [r["step"] for r in record["history"]] == list(range(1, 9))
    assert "resuming a run of 2 processes on 1" in proc.stdout + proc.stderr
