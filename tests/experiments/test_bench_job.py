"""A tiny kiln-bench sweep end to end (the real console script), then kiln-report on it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from kiln.experiments.bench.bench_config import BenchSettings, register_configs
from kiln.experiments.bench.bench_job import run_bench_job
from kiln.experiments.report.cli import main as report_main
from kiln.experiments.settings.compose import config_dir
from kiln.experiments.settings.job_info import JobInfo

CONFIGS = config_dir()
BIN = Path(sys.executable).parent


def test_bench_config_composes_and_validates():
    register_configs()
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("bench", overrides=["precision=bf16-mixed", "compile=none"])
        assert cfg.trainer.precision == "bf16-mixed" and cfg.compile.mode == "none"
        assert cfg.logger.job_type == "bench" and cfg.model.name == "bert-tiny-cls"
        for sweep in ("bench_hf", "bench_timm"):
            swept = compose("bench", overrides=[f"sweep={sweep}"], return_hydra_config=True)
            models = swept.hydra.sweeper.params.model.split(",")
            assert len(models) >= 10
            for model in models:  # every swept model config exists and composes
                assert compose("bench", overrides=[f"model={model}"]).model.arch
    with pytest.raises(ValueError, match=r"bench.batch_size=0"):
        BenchSettings(batch_size=0)
    with pytest.raises(ValueError, match=r"bench.tolerance"):
        BenchSettings(tolerance=-1.0)


def test_bench_job_in_process_writes_bench_json(tmp_path):
    register_configs()
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose(
            "bench",
            overrides=[
                "compile.backend=aot_eager",
                "logger=none",
                "bench.repeats=2",
                "bench.warmup=0",
                "bench.batch_size=2",
                "bench.memory_steps=0",
                f"paths.output_dir={tmp_path}",
            ],
        )
    job = JobInfo(
        output_dir=str(tmp_path), overrides=["compile.backend=aot_eager"], job_name="bench"
    )
    record = run_bench_job(cfg, job)
    on_disk = json.loads((tmp_path / "bench.json").read_text())
    assert record["status"] == on_disk["status"] == "pass", record["reason"]
    for key in (
        "speedup",
        "speedup_p25",
        "speedup_p75",
        "eager_median_s",
        "compiled_median_s",
        "compile_time_s",
        "graph_breaks",
        "recompiles",
        "accuracy",
        "machine",
        "method",
    ):
        assert key in on_disk, key
    assert on_disk["compile_mode"] == "default" and on_disk["wandb"] is None


@pytest.mark.slow
def test_tiny_bench_sweep_end_to_end(tmp_path):
    sweep_dir = tmp_path / "sweep"
    env = {
        **os.environ,
        "WANDB_MODE": "offline",
        "HF_HUB_OFFLINE": "1",
        "KILN_LOG_DIR": str(tmp_path),
    }
    cmd = [
        str(BIN / "kiln-bench"),
        "-m",
        "compile=none,default",
        "compile.backend=aot_eager",
        "model=bert-tiny-cls",
        "bench.repeats=3",
        "bench.warmup=1",
        "bench.batch_size=4",
        "logger=wandb",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(p.read_text()) for p in sorted(sweep_dir.glob("*/bench.json"))]
    assert [r["compile_mode"] for r in records] == ["none", "default"]
    for record in records:
        assert record["kind"] == "bench" and record["status"] == "pass", record["reason"]
        assert record["model"] == "bert-tiny-cls" and record["precision"] == "32-true"
        assert record["speedup"] > 0 and record["accuracy"]["ok"]
        assert record["machine"]["torch"] and record["config"]["bench"]["repeats"] == 3
        wandb_dir = Path(record["output_dir"]) / record["wandb"]["dir"]
        assert wandb_dir.is_dir() and not Path(record["wandb"]["dir"]).is_absolute()
    assert records[0]["accuracy"]["grad_rel_err"] == 0.0  # the control: eager against eager

    assert report_main([str(sweep_dir), "--quiet", "--wandb"]) == 0
    assert (sweep_dir / "speedup.png").is_file()
    summary = (sweep_dir / "bench_summary.csv").read_text().splitlines()
    assert len(summary) == 3 and summary[0].startswith(
        "suite,compile_mode,precision,control,machine,models"
    )
    assert list((sweep_dir / "report" / "wandb").glob("offline-run-*"))
