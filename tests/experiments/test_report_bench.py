"""kiln-report on a bench sweep: geometric mean over passing models, pass rate over all."""

import csv
import json

import pytest

from kiln.experiments.report.bench import model_rows, summary_rows
from kiln.experiments.report.cli import build_report, main

MACHINE = {
    "device": "cpu",
    "device_count": 0,
    "cpu_count": 2,
    "torch": "2.x",
    "cuda": None,
    "hostname": "box",
}


def bench_record(model, mode, precision, status, speedup, compile_s=10.0, mem_ratio=1.0):
    return {
        "kind": "bench",
        "status": status,
        "reason": None if status == "pass" else "why",
        "overrides": [f"model={model}", f"compile={mode}", f"precision={precision}"],
        "job_name": "bench",
        "sweep_dir": "x",
        "model": model,
        "precision": precision,
        "compile_mode": mode,
        "batch_size": 8,
        "repeats": 5,
        "speedup": speedup,
        "speedup_p25": None if speedup is None else speedup * 0.9,
        "speedup_p75": None if speedup is None else speedup * 1.1,
        "speedup_ci_low": None if speedup is None else speedup * 0.8,
        "speedup_ci_high": None if speedup is None else speedup * 1.2,
        "significant": speedup is not None and not speedup * 0.8 <= 1.0 <= speedup * 1.2,
        "eager_median_s": 0.02,
        "compiled_median_s": None if not speedup else 0.02 / speedup,
        "compile_time_s": compile_s,
        "memory_eager_mb": 100.0,
        "memory_compiled_mb": None if mem_ratio is None else 100.0 * mem_ratio,
        "memory_ratio": mem_ratio,
        "graph_breaks": 1,
        "recompiles": 0,
        "accuracy": {
            "loss_rel_err": 1e-6,
            "grad_rel_err": 1e-5,
            "tolerance": 1e-4,
            "ok": status == "pass",
        },
        "machine": MACHINE,
        "method": "interleaved",
        "config": {},
    }


FIXTURE = [
    bench_record("a", "default", "32-true", "pass", 2.0, compile_s=10.0, mem_ratio=0.5),
    bench_record("b", "default", "32-true", "pass", 0.5, compile_s=20.0, mem_ratio=2.0),
    bench_record("c", "default", "32-true", "fail", 8.0, compile_s=99.0, mem_ratio=9.0),
    bench_record("d", "default", "32-true", "error", None, compile_s=None, mem_ratio=None),
    bench_record("a", "none", "32-true", "pass", 1.0),
    bench_record("b", "none", "32-true", "pass", 1.0),
]


@pytest.fixture
def sweep(tmp_path):
    for i, record in enumerate(FIXTURE):
        job = tmp_path / str(i)
        job.mkdir()
        (job / "bench.json").write_text(json.dumps(record))
    return tmp_path


def test_summary_arithmetic():
    summary = {(r["compile_mode"], r["precision"]): r for r in summary_rows(model_rows(FIXTURE))}
    default = summary[("default", "32-true")]
    assert default["models"] == 4 and default["passed"] == 2
    assert default["pass_rate"] == pytest.approx(0.5)  # over all models, errors included
    assert default["geomean_speedup"] == pytest.approx(1.0)  # sqrt(2 * 0.5): passing only
    assert default["mean_compile_time_s"] == pytest.approx(15.0)
    assert default["geomean_memory_ratio"] == pytest.approx(1.0)
    assert default["graph_breaks"] == 4
    # a: 2.0 [1.6, 2.4] a win, b: 0.5 [0.4, 0.6] a loss; c (8.0) failed and does not count
    assert default["significant_wins"] == 1 and default["significant_losses"] == 1
    control = summary[("none", "32-true")]
    assert control["pass_rate"] == 1.0 and control["geomean_speedup"] == pytest.approx(1.0)
    assert control["significant_wins"] == 0 and control["significant_losses"] == 0  # 1.0: noise


def test_group_with_nothing_passing_has_no_mean():
    rows = model_rows([bench_record("x", "max-autotune", "bf16-mixed", "fail", 3.0)])
    (summary,) = summary_rows(rows)
    assert summary["pass_rate"] == 0.0
    assert summary["geomean_speedup"] is None and summary["mean_compile_time_s"] is None


def test_report_writes_markdown_csv_and_plot(sweep, capsys):
    report = build_report(sweep)
    names = {p.name for p in report["files"]}
    assert {"report.md", "bench_summary.csv", "bench_models.csv", "speedup.png"} <= names
    assert (sweep / "speedup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with (sweep / "bench_summary.csv").open() as handle:
        rows = {(r["compile_mode"], r["precision"]): r for r in csv.DictReader(handle)}
    assert float(rows[("default", "32-true")]["geomean_speedup"]) == pytest.approx(1.0)
    assert float(rows[("default", "32-true")]["pass_rate"]) == pytest.approx(0.5)
    with (sweep / "bench_models.csv").open() as handle:
        assert len(list(csv.DictReader(handle))) == len(FIXTURE)
    md = (sweep / "report.md").read_text()
    assert "cpu (0 GPU, 2 CPU cores), torch 2.x" in md  # the machine in the header
    assert "Bench method: interleaved" in md
    assert "| - | default | 32-true | no | - | 4 | 2 | 50% | 1.000 | 1 | 1 |" in md
    printed = capsys.readouterr().out
    assert "bench_summary" in printed and "50%" in printed


def test_cli_on_a_directory_without_jobs(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "no job records" in capsys.readouterr().err
    assert main([str(tmp_path / "missing")]) == 2


def test_unreadable_job_file_is_listed(sweep):
    (sweep / "bad").mkdir()
    (sweep / "bad" / "bench.json").write_text("{not json")
    build_report(sweep, show=False)
    assert "Unreadable job files" in (sweep / "report.md").read_text()
