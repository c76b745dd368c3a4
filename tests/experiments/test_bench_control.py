"""kiln-bench's control (``compile=none``: eager against eager) is the noise gauge: no compile
time, named as the control, and a reading away from 1.0 marks its precision's groups
``noisy machine`` in the report's table, report.md and the bench job's W&B summary."""

import json
from pathlib import Path

from in_process import kiln_command

from kiln.experiments.bench.harness import control_noise
from kiln.experiments.report.cli import build_report
from kiln.experiments.tracking.wandb_files import find_run_file, read_summary

FAST = ["bench.repeats=3", "bench.warmup=0", "bench.batch_size=2", "bench.memory_steps=0"]


def _bench(job_dir: Path, overrides: list[str]) -> dict:
    """One kiln-bench job into ``job_dir`` (in-process); its ``bench.json``."""
    env = {"WANDB_MODE": "offline", "KILN_LOG_DIR": str(job_dir.parent)}
    proc = kiln_command("bench", [*FAST, *overrides, f"hydra.run.dir={job_dir}"], env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((job_dir / "bench.json").read_text())


def test_the_control_has_no_compile_time_and_flags_a_noisy_machine(tmp_path):
    record = _bench(tmp_path / "0", ["compile=none", "logger=wandb"])
    assert record["status"] == "pass", record["reason"]
    assert record["control"] is True and record["compile_time_s"] is None
    assert record["noisy_machine"] == control_noise(record)
    assert record["machine"]["calibration_before"]["matmul_gflop_per_s"] > 0
    summary = read_summary(find_run_file(tmp_path / "0"))
    assert summary["bench/control"] is True
    assert summary.get("bench/noisy_machine") == record["noisy_machine"]

    # the control: 1.385 with an interval of 0.36-3.63, next to a compiled job
    noisy = {**record, "speedup": 1.385, "speedup_ci_low": 0.36, "speedup_ci_high": 3.63}
    compiled = {**record, "compile_mode": "default", "control": False, "compile_time_s": 2.0}
    for i, rec in enumerate([noisy, compiled], start=1):
        (tmp_path / str(i)).mkdir()
        (tmp_path / str(i) / "bench.json").write_text(json.dumps(rec))
    (tmp_path / "0" / "bench.json").unlink()
    report = build_report(tmp_path, show=False)
    columns, rows = report["tables"]["bench_summary"]
    by_mode = {r["compile_mode"]: r for r in rows}
    why = "noisy machine: bert-tiny-cls control 1.385 outside [0.95, 1.05]"
    assert by_mode["none"]["machine"] == by_mode["default"]["machine"] == why
    assert by_mode["none"]["control"] is True and by_mode["default"]["control"] is False
    assert by_mode["none"]["mean_compile_time_s"] is None  # a control compiles nothing
    assert "control" in columns and why in (tmp_path / "report.md").read_text()
    models = report["tables"]["bench_models"][1]
    assert [r["control"] for r in models] == [False, True]
