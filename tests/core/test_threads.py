"""trainer.threads_per_rank: the intra-op threads every rank computes with, decided by kiln
whatever started the process (kiln.core.distributed.threads)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import launch_workers
import psutil
import pytest
import torch

from kiln.core import TrainerConfig
from kiln.core.distributed.launch import launch
from kiln.core.distributed.threads import (
    apply_threads_per_rank,
    default_threads_per_rank,
    threads_per_rank,
)
from kiln.core.telemetry.machine import usable_cores


@pytest.fixture
def restored_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_the_default_depends_on_the_job_size_not_on_its_layout():
    for cores in (1, 2, 8, 64):
        for world in (1, 2, 4, 8):
            layouts = [(d, world // d) for d in (1, 2, 4, 8) if world % d == 0]
            counts = {default_threads_per_rank(d, n, cores=cores) for d, n in layouts}
            assert counts == {max(1, cores // world)}, (cores, world, layouts)


def test_the_default_counts_the_cores_this_process_may_use(monkeypatch):
    for name in ("SLURM_CPUS_ON_NODE", "SLURM_CPUS_PER_TASK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(psutil.Process, "cpu_affinity", lambda self, cpus=None: list(range(8)))
    assert usable_cores() == 8  # (no cgroup quota on the test machine)
    assert default_threads_per_rank(2, 1) == 4
    # SLURM's CPUs for the job on this node: task/none binds nothing, the affinity says 8
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "2")
    assert usable_cores() == 2 and default_threads_per_rank(1, 1) == 2
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "8")
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    assert usable_cores(ranks_on_node=2) == 2  # each of 2 tasks holds one
    assert default_threads_per_rank(2, 1) == 1
    monkeypatch.setattr(psutil.Process, "cpu_affinity", lambda self, cpus=None: [3])  # a cpuset
    assert usable_cores(ranks_on_node=2) == 1


def test_an_explicit_count_overrides_the_default():
    assert threads_per_rank(TrainerConfig(devices=2, threads_per_rank=3)) == 3
    for auto in (None, "auto"):
        default = default_threads_per_rank(2, 1)
        assert threads_per_rank(TrainerConfig(devices=2, threads_per_rank=auto)) == default


@pytest.mark.parametrize("bad", [0, -2, "two", "3", 1.5, True])
def test_a_bad_count_is_refused_naming_the_key_and_what_is_valid(bad):
    with pytest.raises(
        ValueError, match=r"trainer\.threads_per_rank=.* is not valid; use an integer"
    ):
        TrainerConfig(threads_per_rank=bad)


def test_every_launchers_default_gives_way_to_the_jobs_count(restored_threads, monkeypatch):
    """What each launcher leaves a rank of a 2-rank job with on this machine becomes the same
    count once kiln applies its own, and stays so through Lightning's ``fabric.launch()``,
    which sets ``cores // local processes`` where ``OMP_NUM_THREADS`` is unset."""
    from lightning.fabric.utilities.distributed import _set_num_threads_if_needed

    cores = usable_cores()
    given = {  # (the job, what the launcher's environment says, the threads it gave)
        "slurm 2 nodes x 1": (TrainerConfig(devices=1, num_nodes=2), None, cores),
        "local 1 node x 2": (TrainerConfig(devices=2), str(max(1, cores // 2)), cores // 2),
        "torchrun 1 node x 2": (TrainerConfig(devices=2), "1", 1),
        "torchrun 2 nodes x 1": (TrainerConfig(devices=1, num_nodes=2), None, cores),
    }
    applied = {}
    for name, (trainer, omp, launcher_threads) in given.items():
        if omp is None:
            monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        else:
            monkeypatch.setenv("OMP_NUM_THREADS", omp)
        torch.set_num_threads(max(1, launcher_threads))
        count = apply_threads_per_rank(trainer)
        _set_num_threads_if_needed(num_processes=trainer.devices)  # fabric.launch()
        applied[name] = (count, torch.get_num_threads())
    expected = default_threads_per_rank(2, 1)
    assert applied == dict.fromkeys(given, (expected, expected)), applied


@pytest.mark.process
def test_local_workers_and_torchrun_ranks_compute_with_the_same_threads(monkeypatch, tmp_path):
    """Real processes, no OMP_NUM_THREADS: kiln's launcher (1 node x 2), torchrun (1 node x 2)
    and two torchrun agents (as 2 nodes x 1; torchrun leaves a lone rank torch's default)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    local = launch(launch_workers.threads_of_a_rank, 2, 2, 1)

    def torchrun(nodes: int, nproc: int) -> list[dict]:
        common = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
        if nodes == 1:
            common += ["--standalone"]
        else:
            port = 29000 + os.getpid() % 1000
            common += [f"--nnodes={nodes}", "--rdzv-backend=c10d"]
            common += [f"--rdzv-endpoint=127.0.0.1:{port}"]
        script = [str(Path(launch_workers.__file__)), str(nproc), str(nodes)]
        out_dir = tmp_path / f"{nodes}x{nproc}"  # each rank writes result-<rank>.json here
        out_dir.mkdir()
        agents = [
            subprocess.Popen(
                [*common, *([f"--node-rank={i}"] if nodes > 1 else []), *script],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                cwd=out_dir,
            )
            for i in range(nodes)
        ]
        outs = [agent.communicate(timeout=300)[0] for agent in agents]
        assert [a.returncode for a in agents] == [0] * nodes, outs
        results = [json.loads(f.read_text()) for f in out_dir.glob("result-*.json")]
        return sorted(results, key=lambda r: r["rank"])

    one_node, two_nodes = torchrun(1, 2), torchrun(2, 1)
    expected = default_threads_per_rank(2, 1)
    for name, ranks in (("local", local), ("torchrun", one_node), ("2 agents", two_nodes)):
        assert [r["rank"] for r in ranks] == [0, 1], (name, ranks)
        assert [r["threads"] for r in ranks] == [expected, expected], (name, ranks)
    # which is news only because the launchers gave other counts (a lone torchrun rank
    # keeps torch's default of one thread per core)
    if usable_cores() >= 2:
        assert [r["given"] for r in two_nodes] != [r["given"] for r in local], (two_nodes, local)


def test_the_calibration_measures_the_machine_on_every_core_whatever_the_jobs_count(
    restored_threads,
):
    """Jobs of 1 and of 2 ranks per node compute with other counts; their calibrations (the
    machine's speed, compared by kiln-report) must not follow them."""
    from kiln.core.telemetry.machine import calibrate

    torch.set_num_threads(1)
    assert calibrate(budget_s=0.01)["threads"] == usable_cores()
    assert torch.get_num_threads() == 1  # the job's count again
