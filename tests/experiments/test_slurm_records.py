"""What kiln reads from SLURM's own records, fed with output captured from the real
``scontrol`` of the local cluster (``scripts/slurm_local.sh``; ``data/scontrol/``): whether a
job is being preempted, and ``hydra.launcher.preempt_requeue=auto`` following its partition's
``PreemptMode`` (``REQUEUE`` on ``low``, ``CANCEL`` on ``lowcancel``). The cluster tests
(``test_slurm_multinode.py``) preempt real jobs; this proves the reading in make test.

Captured with ``scontrol show partition --oneliner`` and, for the preempted job, ``scontrol
show job <id> --oneliner`` during its grace time, after a job on ``high`` took its nodes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.experiments.launchers.slurm import preemption_of, scontrol_fields

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
