"""kiln reads W&B's ``.wandb`` files through the installed wandb's ``wandb leet inspect
--json``: it reads what that wandb writes, and a file it cannot read is refused loudly, so a
W&B release that drops or changes the command fails here, not in a resumed job's backfill."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import wandb

from kiln.experiments.tracking.tracker import STEP_METRIC
from kiln.experiments.tracking.wandb_files import (
    WandbFormatError,
    find_run_file,
    last_logged_step,
    read_history,
    read_run,
    read_summary,
)

WRITE_RUN = """
import sys, wandb
run = wandb.init(mode="offline", dir=sys.argv[1], project="kiln-format", config={"lr": 0.5},
                 settings=wandb.Settings(console="off", silent=True))
run.define_metric(sys.argv[2])
run.define_metric("*", step_metric=sys.argv[2], step_sync=True)
for step in range(1, 6):
    run.log({sys.argv[2]: step, "train/loss": 1.0 / step})
run.summary["val/accuracy"] = 0.75
run.finish()
"""


@pytest.fixture(scope="module")
def run_file(tmp_path_factory):
    """A real offline run of the installed wandb, written by a process of its own (W&B's
    service writes the file out when the process ends): 5 steps, a summary, a config."""
    directory = tmp_path_factory.mktemp("wandb-format")
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}  # a service of its own
    subprocess.run(
        [sys.executable, "-c", WRITE_RUN, str(directory), STEP_METRIC],
        check=True,
        env={**env, "WANDB_MODE": "offline"},
        timeout=300,
    )
    return find_run_file(directory)


def test_the_installed_wandb_writes_a_format_kiln_reads(run_file):
    rows = [r for r in read_history(run_file) if STEP_METRIC in r]
    assert [(r[STEP_METRIC], r["train/loss"]) for r in rows] == [(s, 1.0 / s) for s in range(1, 6)]
    assert last_logged_step([run_file], STEP_METRIC) == 5
    assert read_summary(run_file)["val/accuracy"] == 0.75
    info = read_run(run_file)
    assert info["config"]["lr"] == 0.5 and info["exit_code"] == 0


def test_an_unknown_format_version_is_refused_by_name(run_file, tmp_path):
    data = bytearray(run_file.read_bytes())
    data[6] = 0xFF  # the header's format version byte: one no wandb wrote
    changed = tmp_path / run_file.name
    changed.write_bytes(bytes(data))
    with pytest.raises(
        WandbFormatError, match=rf"wandb {wandb.__version__} cannot read .*newer wandb"
    ):
        last_logged_step([changed], STEP_METRIC)  # a backfill guesses nothing
    with pytest.raises(WandbFormatError):
        read_history(changed)


def test_a_damaged_tail_keeps_the_steps_before_it(run_file, tmp_path):
    cut = tmp_path / run_file.name
    cut.write_bytes(run_file.read_bytes()[:-7])  # a killed attempt's half-written record
    assert last_logged_step([cut], STEP_METRIC) == 5


def test_a_file_that_is_not_a_run_is_refused(tmp_path):
    junk = tmp_path / "run-junk.wandb"
    junk.write_bytes(b"not a transaction log" * 10)
    with pytest.raises(WandbFormatError, match="cannot read"):
        read_summary(junk)
