"""``kiln-train ... trainer.strategy=fsdp``: trains on 2 gloo
processes and writes sharded checkpoints, which kiln-export turns into one HF directory
and kiln-eval evaluates, each in a single process."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from export_helpers import export_case, kiln, plain_outputs
from train_helpers import FAST, compose_train, explain, job_dirs, run_train, summary

from kiln.core import TrainerConfig
from kiln.core.config import FSDPConfig
from kiln.experiments.jobs.trained_model import load_trained_module, resolve_checkpoint

COMMAND = ["debug=fast", "trainer.devices=2", "trainer.accelerator=cpu", "trainer.strategy=fsdp"]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("fsdp")
    proc = run_train(COMMAND, log_dir, timeout=900, process=True)
    assert proc.returncode == 0, explain(proc)
    return job_dirs(log_dir)[0]


@pytest.mark.process
def test_kiln_train_with_fsdp_on_two_cpu_processes_writes_sharded_checkpoints(job):
    record = summary(job)
    assert record["status"] == "ok" and record["devices"] == 2
    assert record["config"]["trainer"]["strategy"] == "fsdp"
    checkpoint = resolve_checkpoint(job)
    assert checkpoint.is_dir() and checkpoint.name == "step-00000006.ckpt"
    names = sorted(p.name for p in checkpoint.iterdir())
    assert names == [".metadata", "__0_0.distcp", "__1_0.distcp", "checksums.json", "meta.pt"]


@pytest.mark.process
def test_kiln_export_and_eval_take_a_sharded_checkpoint(job, tmp_path):
    out = tmp_path / "exported"
    proc = kiln("export", job, out)
    assert proc.returncode == 0, explain(proc)
    record = json.loads((out / "kiln_export.json").read_text())
    assert record["checkpoint"] == str(resolve_checkpoint(job).resolve())
    module, _ = load_trained_module(record["checkpoint"])
    case, expected = export_case(module, out)
    got = plain_outputs({"fsdp": case}, tmp_path)
    assert torch.equal(got["fsdp"], expected)
    # training validated 2 batches on each of 2 ranks: the same 4 batches in one process
    proc = kiln("eval", job, "--limit-batches", 4, "--wandb-mode", "disabled")
    assert proc.returncode == 0, explain(proc)
    result = json.loads((job.parent / f"{job.name}-eval" / "eval.json").read_text())
    for key, value in summary(job)["metrics"].items():
        assert result["metrics"][key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


@pytest.mark.process  # the 2-process job of the fixture
def test_a_two_device_fsdp_job_resumes_on_one_device_with_or_without_fsdp(job, tmp_path):
    """resume=auto on one process continues the job's sharded checkpoint: unsharded
    (trainer.strategy=auto) or as FSDP on a mesh of one rank, the same global batch kept."""
    for strategy in ("auto", "fsdp"):
        copy = tmp_path / strategy
        shutil.copytree(job, copy)  # the other tests read the job as it ended
        one = [
            "debug=fast",
            "trainer.accelerator=cpu",
            "trainer.devices=1",
            f"trainer.strategy={strategy}",
            "trainer.accumulate_grad_batches=2",
            f"hydra.run.dir={copy}",
        ]
        proc = run_train([*one, "trainer.max_steps=8"], tmp_path)
        assert proc.returncode == 0, explain(proc)
        record = summary(copy)
        assert record["status"] == "ok" and record["global_step"] == 8, record["error"]
        assert record["devices"] == 1
        assert [a["from_step"] for a in record["attempts"]][-1] == 6
        assert [r["step"] for r in record["history"]] == list(range(1, 9))
        assert "resuming a run of 2 processes on 1" in proc.stdout + proc.stderr
        names = sorted(p.name for p in resolve_checkpoint(copy).iterdir())
        assert names == [".metadata", "__0_0.distcp", "checksums.json", "meta.pt"]


def test_a_one_device_job_continues_under_fsdp(tmp_path):
    job_dir = tmp_path / "J"
    first = [*FAST, "logger=csv", "trainer.accelerator=cpu", f"hydra.run.dir={job_dir}"]
    proc = run_train(first, tmp_path)
    assert proc.returncode == 0, explain(proc)
    proc = run_train([*first, "trainer.strategy=fsdp", "trainer.max_steps=6"], tmp_path)
    assert proc.returncode == 0, explain(proc)
    record = summary(job_dir)
    assert record["status"] == "ok" and record["global_step"] == 6, record["error"]
    assert [a["from_step"] for a in record["attempts"]] == [0, 4]


def test_fsdp_options_compose_and_reach_the_trainer_config():
    cfg = compose_train(
        ["trainer.strategy=fsdp", "trainer.devices=2", "trainer.fsdp.reshard_after_forward=false"]
    )
    assert cfg.trainer.fsdp.sharding == "full" and cfg.trainer.fsdp.cpu_offload is False
    from omegaconf import OmegaConf

    trainer = TrainerConfig(**OmegaConf.to_container(cfg.trainer, resolve=False))
    assert trainer.fsdp == FSDPConfig(reshard_after_forward=False)
    with pytest.raises(Exception, match="reshard"):
        compose_train(["trainer.fsdp.reshard=true"])
