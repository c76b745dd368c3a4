"""``scripts/bench_peers.py``: kiln's default job against HF Trainer and the Lightning
Trainer on the same work (the peers in their own environment). Figures are printed, never
asserted; what is asserted is that the three ran the same job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.models.optim import SchedulerConfig, lr_factor

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "peers"))
import peer_common  # noqa: E402


@pytest.mark.parametrize("name", ["linear", "cosine", "constant"])
def test_peers_schedule_is_kilns(name):
    config = SchedulerConfig(name=name, warmup_ratio=0.1, min_lr_ratio=0.05)
    job = {"schedule": name, "schedule_warmup_steps": config.warmup(100), "max_steps": 100}
    job["min_lr_ratio"] = 0.05
    for step in range(101):
        assert peer_common.lr_factor(step, job) == pytest.approx(lr_factor(step, 100, config))


def test_peers_metrics_are_kilns():
    import torch

    from kiln.models.classification import classification_metrics

    preds = torch.tensor([1, 0, 1, 1, 0, 0, 1])
    labels = torch.tensor([1, 0, 0, 1, 1, 0, 1])
    loss = torch.zeros(7)
    kiln = classification_metrics({"preds": preds, "labels": labels, "loss": loss}, 2)
    peer = peer_common.metrics(preds.numpy(), labels.numpy())
    assert peer == pytest.approx({k: kiln[k] for k in ("accuracy", "f1")})


@pytest.mark.long  # a kiln-train job, about 15 s; the peers run in make test-slow
def test_the_export_of_kilns_job_holds_its_weights_rows_and_hyperparameters(tmp_path):
    """The step bench_peers.py runs in kiln's own environment (the peers' needs none of kiln)."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "peers" / "export_kiln_job.py"), str(tmp_path),
         "+model.tiny=true", "trainer.max_steps=3"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    job = json.loads((tmp_path / "job.json").read_text())
    assert job["max_steps"] == 3 and job["init_weights_sha256"] and job["no_decay"]
    rows = (tmp_path / "train.jsonl").read_text().splitlines()
    assert len(rows) == 3 * job["batch_size"]  # one line per row of each step, in kiln's order
    assert (tmp_path / "model" / "config.json").is_file()


def test_the_verdict_calls_a_ratio_a_result_only_beyond_the_run_to_run_spread():
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_peers import verdict

    def runs(*walls):
        return [{"wall_s": w} for w in walls]

    hf = runs(60.0, 64.0, 62.0, 66.0, 61.0)
    faster = {"kiln": runs(54.0, 57.0, 55.0, 59.0, 54.5), "hf": hf}
    assert verdict(faster, "hf", "wall_s").endswith(": kiln faster")
    slower = {"kiln": runs(66.0, 70.0, 68.0, 72.0, 67.0), "hf": hf}
    assert verdict(slower, "hf", "wall_s").endswith(": kiln slower")
    noisy = {"kiln": runs(58.0, 66.0, 61.0, 63.0, 62.5), "hf": hf}
    said = verdict(noisy, "hf", "wall_s")
    assert said.startswith("kiln / hf wall 1.008x, 95% interval") and said.endswith("spread")
    one = {"kiln": runs(50.0), "hf": runs(60.0)}
    assert verdict(one, "hf", "wall_s").endswith("one round: no interval")


@pytest.mark.slow  # builds the peers' environment and runs three jobs
def test_bench_peers_runs_the_same_job_three_ways(tmp_path):
    out = tmp_path / "peers.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_peers.py"), "--steps", "3", "--runs",
         "1", "--logger", "none", "--override", "+model.tiny=true",
         "--env-dir", str(tmp_path / "env"), "--json", str(out)],
        capture_output=True, text=True, timeout=1500, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "kiln / hf" in proc.stdout and "kiln / lightning" in proc.stdout, proc.stdout
    record = json.loads(out.read_text())
    assert record["versions"]["transformers"] and record["versions"]["lightning"]
    for variant in ("kiln", "hf", "lightning"):
        (run,) = record["results"][variant]
        assert run["validations"] == 1, (variant, run)  # the last step's, as kiln does
        assert 0 < run["startup_s"] < run["wall_s"] and run["cpu_s"] > 0, (variant, run)
        assert run["step_s"] > 0 and run["after_training_s"] > 0, (variant, run)
        assert 0.5 < run["train_loss"] < 1.0, (variant, run)  # two classes, three steps
