"""One float64 job started three ways ends bit for bit the same: SLURM on 2 nodes x 1 task,
kiln's own launcher on 1 node x 2 workers, torchrun on 1 node x 2 ranks; with no
``OMP_NUM_THREADS`` anywhere, as in a plain shell. Each launcher would give a rank its own
count of intra-op threads (SLURM's task all the cores of its node, the local ones a share):
the float sums then add in other orders. kiln's ``trainer.threads_per_rank`` is the same
count on all three, recorded in each job's machine block and checkpoint."""

from __future__ import annotations

from pathlib import Path

from test_slurm_multinode import (
    assert_same_weights,
    final_weights,
    one_node_job,
    pytestmark,  # slurm, and a cluster of two nodes
    torchrun_job,
    two_node_job,
)

from kiln.core.checkpoints.load import read_checkpoint_meta
from kiln.core.distributed.threads import default_threads_per_rank

__all__ = ["pytestmark"]


def test_slurm_local_workers_and_torchrun_end_bit_identical(monkeypatch, tmp_path):
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # a shell that never set them
        monkeypatch.delenv(name, raising=False)
    records = {
        "slurm 2 nodes x 1": two_node_job(tmp_path / "slurm", devices=1)[1],
        "local 1 node x 2": one_node_job(tmp_path / "local", devices=2),
        "torchrun 1 node x 2": torchrun_job(tmp_path / "torchrun", devices=2),
    }
    for name, record in records.items():
        assert record["status"] == "ok", (name, record["error"])
    slurm = records["slurm 2 nodes x 1"]
    for name, record in records.items():
        assert record["history"] == slurm["history"], name  # every step's loss and norm
        assert_same_weights(final_weights(record), final_weights(slurm))
    # every node of the local cluster is this machine: the same cores for every launcher
    expected = default_threads_per_rank(2, 1)
    for name, record in records.items():
        assert record["machine"]["threads_per_rank"] == expected, name
        # what fit computed with (torch's count when it saved), not only what was asked
        checkpoint = Path(record["output_dir"]) / record["checkpoint"]
        assert read_checkpoint_meta(checkpoint)["threads_per_rank"] == expected, name
