"""The launcher configs give each job the GPUs and cores that ``trainer`` asks for."""

import pytest
from train_helpers import compose_train

from kiln.experiments.settings.resolvers import if_cuda, uses_cuda


@pytest.mark.parametrize(("accelerator", "devices", "gpus"), [("cuda", 2, 2), ("cpu", 2, 0)])
@pytest.mark.parametrize("launcher", ["local_submitit", "slurm"])
def test_launcher_requests_the_gpus_trainer_asks_for(launcher, accelerator, devices, gpus):
    cfg = compose_train(
        [
            f"launcher={launcher}",
            f"trainer.accelerator={accelerator}",
            f"trainer.devices={devices}",
        ],
        hydra_config=True,
    )
    # 0 GPUs makes submitit set CUDA_VISIBLE_DEVICES="" in the job: a GPU job would see none
    assert cfg.hydra.launcher.gpus_per_node == gpus


@pytest.mark.parametrize(("gpus_here", "requested"), [(0, 0), (1, 2), (8, 2)])
def test_auto_accelerator_requests_gpus_only_when_this_machine_has_cuda(
    monkeypatch, gpus_here, requested
):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus_here)  # the machine composing
    cfg = compose_train(
        ["launcher=local_submitit", "trainer.accelerator=auto", "trainer.devices=2"],
        hydra_config=True,
    )
    assert cfg.hydra.launcher.gpus_per_node == requested
    assert uses_cuda("auto") is (gpus_here > 0)


def test_slurm_cores_per_task_follow_the_accelerator_and_can_be_overridden():
    base = ["launcher=slurm", "trainer.devices=2"]
    gpu = compose_train([*base, "trainer.accelerator=cuda"], hydra_config=True)
    cpu = compose_train([*base, "trainer.accelerator=cpu"], hydra_config=True)
    two = compose_train(
        [*base, "trainer.accelerator=cpu", "hydra.launcher.cpus_per_task=2"], hydra_config=True
    )
    assert (gpu.hydra.launcher.cpus_per_task, cpu.hydra.launcher.cpus_per_task) == (8, 1)
    assert two.hydra.launcher.cpus_per_task == 2
    assert cpu.hydra.launcher.tasks_per_node == 2  # one task per device, GPU or not


def test_if_cuda_accepts_lightning_accelerator_names():
    assert if_cuda("CUDA", 1, 0) == 1
    assert if_cuda("gpu", "a", "b") == "a"
    assert if_cuda("cpu", 1, 0) == 0
    assert if_cuda("mps", 1, 0) == 0


def test_slurm_preempt_requeue_defaults_to_auto_and_takes_a_boolean():
    from kiln.experiments.launchers.slurm import check_preempt_requeue

    default = compose_train(["launcher=slurm"], hydra_config=True).hydra.launcher
    no = compose_train(["launcher=slurm", "hydra.launcher.preempt_requeue=false"], True).hydra
    assert default.preempt_requeue == "auto"
    assert check_preempt_requeue(no.launcher.preempt_requeue) == "false"


# a fresh interpreter (about 12 s); test_sweep_checked_whole.py refuses the key in-process
@pytest.mark.long
def test_a_bad_preempt_requeue_is_refused_in_one_line_before_any_job_is_submitted(tmp_path):
    import subprocess
    import sys

    from train_helpers import user_env

    sweep_dir = tmp_path / "sweep"
    proc = subprocess.run(
        [sys.executable, "-m", "kiln.experiments.train", "-m", "launcher=slurm",
         "trainer.accelerator=cpu", "hydra.launcher.preempt_requeue=maybe",
         f"hydra.sweep.dir={sweep_dir}"],
        capture_output=True, text=True, cwd=tmp_path, env=user_env(), timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    # the sweep's check of every job's config refuses it, the launcher's keys with them
    lines = proc.stderr.splitlines()
    assert "sweep refused before any job started" in proc.stderr, proc.stderr
    assert (
        "launcher: hydra.launcher.preempt_requeue='maybe' is not valid: auto (requeue a "
        "preempted job unless its partition's PreemptMode is CANCEL), true (always) or false "
        "(never)"
    ) in lines, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (sweep_dir / ".submitit").exists()  # nothing reached SLURM
