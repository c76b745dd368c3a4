"""``summary.json`` is a :class:`TrainRecord`: kiln-train writes its fields, the end-of-job
table and kiln-report read them, and a summary an older kiln wrote still reads."""

from __future__ import annotations

import csv
import dataclasses
import json

from rich.console import Console
from train_helpers import FAST, explain, job_dirs, run_train, summary

from kiln.experiments.jobs.console import job_table
from kiln.experiments.jobs.train_record import TrainRecord
from kiln.experiments.report.cli import build_report

# A summary.json as kiln wrote it before it recorded why a run stopped, the initial weights'
# hash, the attempts and the step times: it has none of those keys, and one it no longer writes.
OLD_SUMMARY = {
    "kind": "train",
    "status": "ok",
    "error": None,
    "overrides": ["compile=none"],
    "job_name": "train",
    "job_num": 0,
    "run_name": "compile=none",
    "output_dir": "/old/0",
    "sweep_dir": "/old",
    "model": "bert-tiny-cls",
    "precision": "32-true",
    "compile_mode": "none",
    "devices": 1,
    "accumulate_grad_batches": 1,
    "metrics": {"val/accuracy": 0.75},
    "train_loss": 0.42,
    "global_step": 40,
    "telemetry": {"step_time_median_s": 0.02, "step_time_iqr_s": 0.001, "samples_per_s": 400.0},
    "history": [{"step": 20, "train/loss": 0.6}, {"step": 40, "train/loss": 0.42}],
    "checkpoint": None,
    "machine": {"device": "cpu", "device_count": 0},
    "wandb": None,
    "config": {},
    "num_workers_used": 2,
}


def test_kiln_train_writes_exactly_the_record_fields(tmp_path):
    proc = run_train([*FAST, "logger=csv", "compile=none"], tmp_path)
    assert proc.returncode == 0, explain(proc)
    written = summary(job_dirs(tmp_path)[0])
    record = TrainRecord.from_json(written)
    assert record.extra == {}, "summary.json holds keys TrainRecord does not declare"
    unset = {"extra", "profile", "preemption"}  # written with profile=steps, by SLURM only
    assert set(written) == {f.name for f in dataclasses.fields(TrainRecord)} - unset
    assert record.status == "ok" and record.global_step == 4
    assert record.stop_reason == "max_steps" and record.train_loss is not None
    assert record.to_json() == written  # read and written back, nothing changes


def test_an_older_summary_reads_with_defaults_and_keeps_unknown_keys():
    record = TrainRecord.from_json(OLD_SUMMARY)
    assert record.global_step == 40 and record.train_loss == 0.42
    assert record.stop_reason is None and record.attempts is None  # not written then
    assert record.extra == {"num_workers_used": 2}
    assert record.to_json() == {**TrainRecord().to_json(), **OLD_SUMMARY}


def test_kiln_report_and_the_job_table_read_an_older_summary(tmp_path):
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "summary.json").write_text(json.dumps(OLD_SUMMARY))
    build_report(tmp_path, show=False)
    with (tmp_path / "train_runs.csv").open() as handle:
        (row,) = list(csv.DictReader(handle))
    assert row["global_step"] == "40" and row["train_loss"] == "0.42"
    assert row["val/accuracy"] == "0.75" and float(row["step_time_ms"]) == 20.0
    console = Console(width=160, record=True, file=open("/dev/null", "w"))
    console.print(job_table(OLD_SUMMARY))
    text = console.export_text()
    assert "global_step" in text and "40" in text and "0.42" in text
    assert "stopped by" not in text  # the old kiln did not say


def test_a_summary_that_is_not_an_object_is_refused_by_name():
    import pytest

    with pytest.raises(ValueError, match="JSON object, not list"):
        TrainRecord.from_json([1, 2])  # type: ignore[arg-type]
