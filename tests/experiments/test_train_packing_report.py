"""A ``data.packing=false,true`` sweep of kiln-train compares in kiln-report: each job's
``summary.json`` and W&B summary carry real tokens/s and the padding fraction, and the
report's table gives the packed run's tokens/s over the unpacked one's."""

from __future__ import annotations

import csv

import pytest
from train_helpers import FAST, explain, job_dirs, run_train, summary

from kiln.experiments.report.cli import build_report
from kiln.experiments.tracking.wandb_files import find_run_file, read_summary


@pytest.mark.long  # a 2-job sweep, about 13 s; tests/models/test_packing.py proves the packing
def test_a_packing_sweep_reports_real_tokens_padding_and_their_ratio(tmp_path):
    args = ["experiment=tiny_llama_lm", *FAST, "logger=wandb", "data.packing=false,true"]
    proc = run_train(["-m", *args], tmp_path)
    assert proc.returncode == 0, explain(proc)
    padding = {}
    for job in job_dirs(tmp_path):
        record = summary(job)
        telemetry = record["telemetry"]
        assert telemetry["tokens_per_s"] > 0
        wandb = read_summary(find_run_file(job))
        assert wandb["telemetry/padding_fraction"] == telemetry["padding_fraction"]
        assert wandb["telemetry/tokens_per_s"] == telemetry["tokens_per_s"]
        padding[record["config"]["data"]["packing"]] = telemetry["padding_fraction"]
    assert 0 <= padding[True] < padding[False] < 1  # generated sentences pad most of a row

    sweep = job_dirs(tmp_path)[0].parent
    build_report(sweep, show=False)
    with (sweep / "train_runs.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    ratios = {"packing=true" in r["run"].lower(): float(r["tokens_vs_unpacked"]) for r in rows}
    assert len(rows) == 2 and ratios[False] == 1.0 and ratios[True] > 0, rows
