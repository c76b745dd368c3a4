"""The typed records a job writes and kiln-report reads: a sweep's ``summary.json`` files as
an earlier kiln wrote them still make a report, the types name every key the writer writes,
and a record or a ratio comes back from JSON as it went in."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from kiln.core.telemetry.records import Calibration, LoadSample, Telemetry
from kiln.experiments.jobs.train_record import TrainRecord
from kiln.experiments.report.cli import main as kiln_report
from kiln.experiments.report.rows import RATIOS, SPEEDUP, Ratio
from kiln.experiments.settings.job_files import write_job_json
from kiln.experiments.settings.job_info import JobMachine

# two kiln-train jobs (compile=none, compile=default) written by kiln at commit be27e23:
# kiln-train -m debug=fast trainer.max_steps=6 compile.backend=aot_eager compile=none,default
SWEEP = Path(__file__).parent / "data" / "sweep_main"


def _summaries() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(SWEEP.glob("*/summary.json"))]


def _keys(typed: type) -> set[str]:
    return set(typed.__required_keys__) | set(typed.__optional_keys__)  # pyright: ignore[reportAttributeAccessIssue]


def test_kiln_report_reads_summaries_an_earlier_kiln_wrote(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    shutil.copytree(SWEEP, sweep)
    assert kiln_report([str(sweep), "--quiet"]) == 0
    with (sweep / "train_runs.csv").open() as f:
        rows = {r["compile_mode"]: r for r in csv.DictReader(f)}
    eager, compiled = (s["telemetry"] for s in _summaries())
    assert set(rows) == {"none", "default"}
    row = rows["default"]
    assert float(row["compile_time_s"]) == pytest.approx(compiled["compile_time_s"])
    assert float(row["step_time_ms"]) == pytest.approx(compiled["step_time_median_s"] * 1e3)
    assert int(row["measured_steps"]) == compiled["measured_steps"] == 5
    # the speedup from the two runs' step times: medians' ratio, bootstrapped interval
    figure = eager["step_time_median_s"] / compiled["step_time_median_s"]
    assert float(row["speedup_vs_eager"]) == pytest.approx(figure)
    point = np.median(eager["step_times_s"]) / np.median(compiled["step_times_s"])
    low, high = float(row["speedup_ci_low"]), float(row["speedup_ci_high"])
    assert low <= point * float(row["speedup_vs_eager"]) / figure <= high
    assert row["speedup_bootstrap"] == "within runs"
    assert row["speedup_noise"] == "5 steps"
    assert float(rows["none"]["speedup_vs_eager"]) == 1.0
    assert "(noise: 5 steps)" in (sweep / "report.md").read_text()


def test_the_record_types_name_every_key_the_writer_wrote():
    for summary in _summaries():
        assert set(summary) <= _keys_of_record()
        assert set(summary["telemetry"]) <= _keys(Telemetry)
        machine = summary["machine"]
        assert set(machine) <= _keys(JobMachine)
        assert _keys(JobMachine) - set(machine) <= {"matmul_peak", "copy_peak"}  # newer
        for key in ("calibration_before", "calibration_after"):
            assert set(machine[key]) == _keys(Calibration)
        for key in ("load_start", "load_end"):
            assert set(machine[key]) <= _keys(LoadSample)


def _keys_of_record() -> set[str]:
    return set(TrainRecord.__dataclass_fields__) - {"extra"}


def test_a_typed_record_round_trips_through_json(tmp_path):
    summary = _summaries()[1]
    record = TrainRecord.from_json({**summary, "job_dir": "/some/job"})
    assert record.telemetry.get("compile_time_s") == summary["telemetry"]["compile_time_s"]
    assert record.machine is not None and record.machine.get("device") == "cpu"
    assert record.extra == {"job_dir": "/some/job"}  # a key this kiln does not know is kept
    path = write_job_json(tmp_path / "summary.json", record.to_json())
    again = TrainRecord.from_json(json.loads(path.read_text()))
    assert again == record
    assert json.loads(path.read_text()) == {**summary, "job_dir": "/some/job"}


def test_a_ratio_round_trips_through_a_rows_columns_and_json():
    ratio = Ratio(1.8, 1.5, 2.1, None, "unverified: no machine record", "within runs")
    cells = json.loads(json.dumps(ratio.columns(SPEEDUP)))
    assert set(cells) == set(SPEEDUP.all)
    assert cells["speedup_ci_low"] == 1.5 and cells["speedup_verdict"] == ratio.verdict
    assert Ratio.from_row(cells, SPEEDUP) == ratio
    assert Ratio.from_row({}, SPEEDUP) == Ratio()
    # every ratio's columns are its own
    columns = [c for names in RATIOS for c in names.all]
    assert len(columns) == len(set(columns))


@pytest.mark.parametrize(
    ("ratio", "shown"),
    [
        (Ratio(2.0, 1.9, 2.1), "2.00 [1.90, 2.10]"),
        (Ratio(1.03, 0.9, 1.1, "interval spans 1.0"), "1.03 (noise: interval spans 1.0)"),
        (Ratio(0.81, 0.7, 0.9, None, "confounded: load"), "0.81 (confounded: load)"),
        (Ratio(2.0, 1.9, 2.1, None, "unverified: x"), "2.00 [1.90, 2.10] (unverified: x)"),
        (Ratio(None, verdict="unpaired: no compile=none run"), "unpaired: no compile=none run"),
    ],
)
def test_a_ratio_prints_as_one_cell(ratio, shown):
    assert ratio.text(lambda x: f"{x:.2f}") == shown
