"""A callback's checkpoint state through kiln-train: a job re-run without the callback whose
state its checkpoint holds is refused by name in the setup stage, before any W&B run, its
record and checkpoints untouched; ``trainer.allow_changed_state=true`` goes on, and the
attempt records the state it dropped."""

from __future__ import annotations

import json
from pathlib import Path

from train_helpers import FAST, explain, run_train, summary

ARGS = [*FAST, "trainer.checkpoint_every_n_steps=2", "trainer.val_every_n_steps=null"]


def _tree(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


def test_a_callbacks_state_left_behind_is_refused_before_wandb_unless_allowed(tmp_path) -> None:
    job = tmp_path / "job"
    at = f"hydra.run.dir={job}"
    first = run_train([*ARGS, "callbacks=ema", "trainer.max_steps=2", at], tmp_path)
    assert first.returncode == 0, explain(first)
    before = _tree(job)

    refused = run_train([*ARGS, at], tmp_path)  # the same job, without its EMA
    assert refused.returncode == 1, explain(refused)
    said = f"{job}: refused, its record stays as it was: "
    error = next(line for line in refused.stderr.splitlines() if line.startswith(said))
    assert "StateChangedError" in error and "callbacks/EMA" in error, error
    assert "trainer.allow_changed_state=true" in error
    # no W&B run opened, no checkpoint, no attempt: not a byte of the job changed
    assert {k: v for k, v in _tree(job).items() if k != "job.lock"} == {
        k: v for k, v in before.items() if k != "job.lock"
    }
    record = summary(job)
    assert record["status"] == "ok" and record["global_step"] == 2  # the record stands

    allowed = run_train([*ARGS, "trainer.allow_changed_state=true", at], tmp_path)
    assert allowed.returncode == 0, explain(allowed)
    assert "dropped callbacks/EMA" in allowed.stdout + allowed.stderr
    record = summary(job)
    assert record["status"] == "ok" and record["global_step"] == 4
    attempt = record["attempts"][-1]
    assert attempt["changed_state"] == ["callbacks/EMA dropped"], attempt
    assert json.loads((job / "attempts.json").read_text())[-1] == attempt
