"""A kiln-train job keeps the machine sampled through training: in summary.json, and in its
(offline) W&B run's history, beside the machine's own measured matmul peak."""

from __future__ import annotations

import json

from train_helpers import FAST, explain, run_train

from kiln.experiments.tracking.wandb_files import find_run_file, read_history


def test_a_job_keeps_its_machine_series_and_logs_it_to_wandb(tmp_path):
    job = tmp_path / "job"
    args = [*FAST, "trainer.max_steps=30", "trainer.machine_sample_s=0.02", "logger=wandb"]
    proc = run_train([*args, f"hydra.run.dir={job}"], tmp_path)
    assert proc.returncode == 0, explain(proc)
    record = json.loads((job / "summary.json").read_text())
    series = record["telemetry"]["machine_series"]
    assert series["measured_from_step"] == 1  # debug=fast: one warm-up step
    assert series["samples"]["step_end"][-1] == 30
    assert record["machine"]["matmul_peak"]["matmul_peak_gflop_per_s"] > 0
    history = read_history(find_run_file(job))
    logged = [row for row in history if "machine/own_cpu_cores" in row]
    assert logged and all(row["machine/other_cpu_cores"] >= 0 for row in logged), history[-1]
