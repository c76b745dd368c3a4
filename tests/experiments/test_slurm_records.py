"""What kiln reads from SLURM's own records, fed with output captured from the real
``scontrol`` and ``squeue`` of the local cluster (``scripts/slurm_local.sh``;
``data/scontrol/``): whether a job is being preempted, ``hydra.launcher.preempt_requeue=auto``
following its partition's ``PreemptMode`` (``REQUEUE`` on ``low``, ``CANCEL`` on
``lowcancel``), the states of a sweep's jobs, and whether the cluster keeps accounting. The
cluster tests (``test_slurm*.py``) run real jobs; these prove the reading in make test.

Captured with ``scontrol show partition --oneliner``, ``scontrol show job <id> --oneliner``
(a running job; a job of ``low`` in its grace time after a job of ``high`` took its nodes),
``squeue --noheader --array --states=all --format='%i|%T'`` (a 2-task array running, a held
job) and ``scontrol show config``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.experiments.launchers.slurm import (
    accounting_in,
    preemption_of,
    scontrol_fields,
    squeue_states,
)

DATA = Path(__file__).parent / "data" / "scontrol"


def _records(name: str) -> list[dict[str, str]]:
    lines = (DATA / name).read_text().splitlines()
    return [scontrol_fields(line) for line in lines if line.strip()]


PARTITIONS = {record["PartitionName"]: record for record in _records("partitions.txt")}


def _partition(name: str) -> dict[str, str]:
    return PARTITIONS[name]


def _preempted_on(partition: str) -> dict[str, str]:
    """The captured preempted job's record, as if it ran on ``partition`` (only the
    partition's own record says what its PreemptMode is)."""
    (job,) = _records("job-preempted.txt")
    return {**job, "Partition": partition}


def test_the_records_parse_into_fields():
    assert set(PARTITIONS) == {"debug", "low", "lowcancel", "high"}
    assert PARTITIONS["low"]["PreemptMode"] == "REQUEUE"
    assert PARTITIONS["lowcancel"]["PreemptMode"] == "CANCEL"
    (job,) = _records("job-preempted.txt")
    assert job["JobState"] == "RUNNING" and job["PreemptTime"] != "None"
    assert job["Partition"] == "low"


@pytest.mark.parametrize(
    ("partition", "setting", "requeued"),
    [
        ("low", "auto", True),
        ("lowcancel", "auto", False),  # the site ends preempted jobs: kiln stops it
        ("lowcancel", "true", True),
        ("low", "false", False),
    ],
)
def test_preempt_requeue_follows_the_partitions_preempt_mode(partition, setting, requeued):
    got = preemption_of(_preempted_on(partition), _partition, setting)
    assert got == {
        "partition": partition,
        "preempt_mode": PARTITIONS[partition]["PreemptMode"],
        "preempt_requeue": setting,
        "requeued": requeued,
    }


def test_a_running_job_nobody_preempts_is_not_preempted():
    (job,) = _records("job-running.txt")
    assert job["JobState"] == "RUNNING" and "PreemptTime" not in job
    assert preemption_of(job, _partition, "auto") == {}
    ended = {**_preempted_on("low"), "JobState": "COMPLETING"}
    assert preemption_of(ended, _partition, "true") == {}


def test_squeue_gives_each_job_and_array_task_its_state():
    states = squeue_states((DATA / "squeue-states.txt").read_text())
    assert states == {"98_0": "RUNNING", "98_1": "RUNNING", "99": "PENDING"}


def test_a_cluster_without_accounting_says_so_in_its_config():
    config = (DATA / "config.txt").read_text()
    assert not accounting_in(config)
    kept = config.replace("accounting_storage/none", "accounting_storage/slurmdbd")
    assert accounting_in(kept)
