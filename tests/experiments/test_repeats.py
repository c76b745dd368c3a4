"""``repeat=range(N)``: each configuration of a sweep runs N times, interleaved (A B A B),
whatever the order of the command line; kiln-report pools the repeats and says it
bootstrapped across them."""

import json

import pytest
from train_helpers import FAST, explain, job_dirs, run_train

from kiln.experiments.report.cli import build_report


@pytest.mark.long  # four jobs, two compiled: about 25 s
def test_repeats_run_interleaved_and_the_report_bootstraps_across_them(tmp_path):
    # repeat= comes last on the command line, where Hydra's basic sweeper varies it fastest
    args = ["-m", *FAST, "logger=csv", "compile=none,default", "repeat=range(2)"]
    proc = run_train(args, tmp_path)
    assert proc.returncode == 0, explain(proc)
    records = [json.loads((d / "summary.json").read_text()) for d in job_dirs(tmp_path)]
    order = [(r["config"]["repeat"], r["compile_mode"]) for r in records]
    assert order == [(0, "none"), (0, "default"), (1, "none"), (1, "default")]

    report = build_report(job_dirs(tmp_path)[0].parent, show=False)
    rows = report["tables"]["train_runs"][1]
    compiled = [r for r in rows if r["compile_mode"] == "default"]
    assert len(compiled) == 2 and compiled[0]["speedup_vs_eager"] is not None
    for row in compiled:  # one figure for the configuration, from both repeats of each side
        assert row["speedup_vs_eager"] == compiled[0]["speedup_vs_eager"]
        assert row["speedup_bootstrap"] == "across 2 and 2 repeats and within runs"
        assert row["speedup_ci_low"] <= row["speedup_vs_eager"] <= row["speedup_ci_high"]
    md = (job_dirs(tmp_path)[0].parent / "report.md").read_text()
    assert "Intervals bootstrapped across 2 and 2 repeats and within runs." in md
