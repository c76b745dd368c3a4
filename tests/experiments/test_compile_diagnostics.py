"""Compile diagnostics of kiln-bench: every graph break with its reason and user source line,
recompile reasons, and kiln-report's list of the models that have them."""

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from kiln.core import CompileConfig
from kiln.experiments.bench.harness import run_benchmark
from kiln.experiments.report.cli import build_report


class Branchy(nn.Module):
    """A contract module whose loss takes a data-dependent branch (a graph break)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        loss = self.linear(batch).pow(2).mean()
        if loss > 0:  # data-dependent control flow: dynamo breaks the graph here
            loss = loss * 1.0
        return {"loss": loss, "num_items": batch.shape[0]}

    def configure_optimizers(self):
        return {"optimizer": torch.optim.SGD(self.parameters(), lr=0.1)}


BRANCH_LINE = Branchy.training_step.__code__.co_firstlineno + 2


def test_a_graph_break_is_recorded_with_reason_and_line_and_listed_by_the_report(tmp_path):
    result = run_benchmark(
        Branchy(),
        torch.randn(3, 4),
        compile_cfg=CompileConfig(mode="default", backend="aot_eager"),
        warmup=0,
        repeats=2,
        memory_steps=0,
    )
    assert result["status"] == "pass", result["reason"]
    assert result["graph_breaks"] >= 1
    top = result["graph_break_reasons"][0]
    assert top.startswith("Data-dependent branching")
    assert top.endswith(f"(at {Path(__file__).name}:{BRANCH_LINE})")
    assert result["graph_break_sites"][0] == f"{__file__}:{BRANCH_LINE}"

    job = tmp_path / "0"
    job.mkdir()
    record = {"kind": "bench", "model": "branchy", "job_name": "bench", **result}
    (job / "bench.json").write_text(json.dumps(record))
    report = build_report(tmp_path, show=False)
    (row,) = report["tables"]["compile_issues"][1]
    assert row["model"] == "branchy" and row["graph_breaks"] == result["graph_breaks"]
    assert row["top_graph_break"] == top
    assert "## Graph breaks and recompiles" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "compile_issues.csv").read_text().count("Data-dependent branching") >= 1


def test_compile_trace_true_keeps_a_tlparse_report_in_the_job_dir_and_logs_it(tmp_path):
    from hydra import compose, initialize_config_dir

    from kiln.experiments.bench.bench_config import register_configs
    from kiln.experiments.bench.bench_job import run_bench_job
    from kiln.experiments.settings.compose import config_dir
    from kiln.experiments.settings.job_info import JobInfo

    register_configs()
    overrides = [
        "compile.backend=aot_eager",
        "compile.trace=true",
        "logger=wandb",
        "bench.repeats=2",
        "bench.warmup=0",
        "bench.batch_size=2",
        "bench.memory_steps=0",
        f"paths.output_dir={tmp_path}",
    ]
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        cfg = compose("bench", overrides=overrides)
    job = JobInfo(output_dir=str(tmp_path), overrides=overrides, job_name="bench")
    record = run_bench_job(cfg, job)
    assert record["status"] == "pass", record["reason"]
    trace = json.loads((tmp_path / "bench.json").read_text())["compile_trace"]
    assert trace["error"] is None, trace
    (log,) = trace["logs"]
    # relative to the job directory: a moved job reads its own
    assert Path(log).parent == Path("compile_trace") and (tmp_path / log).stat().st_size > 0
    (index,) = trace["reports"]
    assert index == "tlparse/index.html"
    assert "compile" in (tmp_path / index).read_text().lower()
    # the report is an artifact of the job's (offline) W&B run
    assert trace["wandb_artifact"] == f"tlparse-{record['wandb']['run_id']}"


@pytest.mark.slow
def test_kiln_train_compile_trace_true_keeps_a_tlparse_report(tmp_path):
    from train_helpers import FAST, job_dirs, run_train

    proc = run_train([*FAST, "compile=default", "compile.trace=true", "logger=csv"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (job,) = job_dirs(tmp_path)
    trace = json.loads((job / "summary.json").read_text())["compile_trace"]
    assert trace["error"] is None, trace
    assert trace["reports"] == [str(job / "tlparse" / "index.html")]
    assert (job / "tlparse" / "index.html").is_file()


def test_a_training_jobs_validation_recompile_is_listed_as_validations():
    from kiln.experiments.report.compile_issues import compile_issue_rows

    reason = "validation: wrapped_forward (wrappers.py:183): 0/0: GLOBAL_STATE changed: grad_mode"
    telemetry = {"recompiles": 1, "validation_recompiles": 1, "recompile_reasons": [reason]}
    record = {"kind": "train", "model": "llama-tiny-lm", "telemetry": telemetry}
    (row,) = compile_issue_rows([record])
    assert (row["recompiles"], row["validation_recompiles"]) == (1, 1)
    assert row["top_recompile"] == reason
