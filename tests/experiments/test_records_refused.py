"""A job refused because another process trains into its directory changes nothing there:
Hydra's files of the job that holds it (``.hydra/config.yaml``, ``overrides.yaml``) and the
sweep's ``multirun.yaml`` stay as that job's sweep wrote them."""

from __future__ import annotations

import re
from pathlib import Path

from train_helpers import FAST, explain, run_train

from kiln.experiments.jobs.lock import job_dir_lock

ARGS = [*FAST, "trainer.max_steps=1", "logger=none"]


def _files(sweep_dir: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(sweep_dir)): p.read_bytes()
        for p in [sweep_dir / "multirun.yaml", *sweep_dir.glob("*/.hydra/*.yaml")]
    }


def test_a_refused_sweep_changes_none_of_the_holders_files(tmp_path):
    sweep_dir = tmp_path / "sweep"
    first = run_train(
        ["-m", *ARGS, "optimizer.lr=1e-3,2e-3", f"hydra.sweep.dir={sweep_dir}"], tmp_path
    )
    assert first.returncode == 0, explain(first)
    before = _files(sweep_dir)
    assert b"0.001" in before["0/.hydra/overrides.yaml"]
    # the first sweep's jobs still training: each holds its directory
    with job_dir_lock(sweep_dir / "0"), job_dir_lock(sweep_dir / "1"):
        second = run_train(
            ["-m", *ARGS, "optimizer.lr=3e-3,4e-3", f"hydra.sweep.dir={sweep_dir}"], tmp_path
        )
    # the job table may wrap the error across its cell's lines
    assert re.search(r"is in[\s│]+use", second.stdout + second.stderr), explain(second)
    assert _files(sweep_dir) == before
