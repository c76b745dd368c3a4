"""``kiln-train ... trainer.strategy=fsdp``: the command of issue 17 trains on 2 gloo
processes and writes sharded checkpoints, which kiln-export turns into one HF directory
and kiln-eval evaluates, each in a single process."""

from __future__ import annotations

import json

import pytest
import torch
from export_helpers import export_case, kiln, plain_outputs
from train_helpers import compose_train, explain, job_dirs, run_train, summary

from kiln.core import TrainerConfig
from kiln.core.config import FSDPConfig
from kiln.experiments.restore import load_trained_module, resolve_checkpoint

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
    result = json.loads((job / "eval.json").read_text())
    for key, value in summary(job)["metrics"].items():
        assert result["metrics"][key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


@pytest.mark.process
def test_fsdp_on_one_process_fails_in_the_config_stage(tmp_path):
    proc = run_train(["debug=fast", "trainer.strategy=fsdp"], tmp_path)
    assert proc.returncode != 0
    assert (
        "trainer.strategy=fsdp shards the model over several processes" in proc.stderr + proc.stdout
    )
    assert summary(job_dirs(tmp_path)[0])["error_stage"] == "config"


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
