"""Inputs that could pass without a word fail in the config stage naming what was
wrong and what is valid, before any W&B run (a warm-up longer than the run only warns);
``summary.json`` says which step ``best.ckpt`` holds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from train_helpers import FAST, explain, refused_in_config, run_train, summary

from kiln.core.telemetry.machine import usable_cores


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """The step-4 checkpoint of a finished job."""
    log_dir = tmp_path_factory.mktemp("silent")
    proc = run_train([*FAST, f"hydra.run.dir={log_dir / 'J'}"], log_dir)
    assert proc.returncode == 0, explain(proc)
    return log_dir / "J" / "checkpoints" / "step-00000004.ckpt"


def _refused(args: list[str], tmp_path: Path, *errors: str) -> dict:
    record, job_dir = refused_in_config(args, tmp_path, *errors)
    assert not list(job_dir.glob("checkpoints/*.ckpt"))
    return record


def test_an_explicit_resume_without_a_checkpoint_dir_is_refused(checkpoint, tmp_path):
    _refused(
        ["trainer.checkpoint_dir=null", f"trainer.resume={checkpoint}"],
        tmp_path,
        f"trainer.resume='{checkpoint}' with trainer.checkpoint_dir=null",
        "would train from step 0",
    )


def test_a_key_added_with_plus_that_the_schema_lacks_is_refused_naming_the_valid_one(tmp_path):
    _refused(
        ["+trainer.max_step=5"],
        tmp_path,
        "trainer.max_step is not a config key",
        "did you mean trainer.max_steps",
    )


def test_more_cpu_workers_than_cores_are_refused_before_any_starts(tmp_path):
    cores = usable_cores()
    devices = cores + 1  # the 64 on 2 cores is refused by the same rule
    _refused(
        ["trainer.accelerator=cpu", f"trainer.devices={devices}"],
        tmp_path,
        f"trainer.devices={devices} would start {devices} CPU worker processes",
        f"give trainer.devices <= {cores}",
    )


def test_a_warmup_longer_than_the_run_warns_in_the_config_stage(tmp_path):
    # the batch is larger than the data: the job fails in its setup stage, after the warning
    args = ["scheduler.warmup_steps=100", "data.batch_size=100", "data.num_train=64"]
    proc = run_train([*FAST, *args, f"hydra.run.dir={tmp_path / 'job'}"], tmp_path)
    assert summary(tmp_path / "job")["error_stage"] == "setup", explain(proc)
    warning = "scheduler.warmup_steps=100 is not shorter than the run's 4 optimizer steps"
    assert warning in proc.stdout + proc.stderr, explain(proc)


def test_kiln_bench_refuses_such_a_key_before_anything_is_written(tmp_path):
    from hydra import compose, initialize_config_dir

    from kiln.experiments.bench.bench_config import register_configs
    from kiln.experiments.bench.bench_job import run_bench_job
    from kiln.experiments.settings.compose import config_dir
    from kiln.experiments.settings.job_info import JobInfo

    register_configs()
    with initialize_config_dir(config_dir(), version_base="1.3"):
        cfg = compose("bench", overrides=["+bench.warmups=3"])
    with pytest.raises(
        ValueError, match=r"bench.warmups is not a config key.*did you mean bench.warmup"
    ):
        run_bench_job(cfg, JobInfo(output_dir=str(tmp_path)))
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("key", ["hydra.run.dir", "hydra.sweep.dir"])
def test_an_output_dir_that_is_a_file_is_named(tmp_path, key):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    multirun = ["-m"] if key == "hydra.sweep.dir" else []
    proc = run_train([*multirun, *FAST, f"{key}={blocker / 'job'}"], tmp_path)
    assert proc.returncode == 1, explain(proc)
    output = proc.stdout + proc.stderr
    assert f"{key}={blocker / 'job'}: {blocker} is a file, not a directory" in output, output
    assert "FileExistsError" not in output and "NotADirectoryError" not in output


def test_the_summary_says_which_step_best_ckpt_holds(tmp_path):
    job_dir = tmp_path / "job"
    # validation at steps 2 and 4; best.ckpt is saved at the better one
    args = ["callbacks=best_checkpoint", "trainer.val_every_n_steps=2"]
    proc = run_train([*FAST, *args, f"hydra.run.dir={job_dir}"], tmp_path)
    assert proc.returncode == 0, explain(proc)
    best = summary(job_dir)["best_checkpoint"]
    path = job_dir / "checkpoints" / "best.ckpt"
    assert best["path"] == "checkpoints/best.ckpt" and best["monitor"] == "val/accuracy"
    saved = torch.load(path / "meta.pt", map_location="cpu", weights_only=True)
    assert best["step"] == saved["loop"]["global_step"] in (2, 4)
    assert best["value"] == saved["loop"]["metrics"]["val/accuracy"]
