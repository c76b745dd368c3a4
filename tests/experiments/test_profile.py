"""kiln-train profile=steps: a Perfetto trace in the job dir, where a step's time goes in
summary.json and the W&B run, and the trace as the run's artifact."""

from __future__ import annotations

import json

import pytest
import torch
from train_helpers import FAST, job_dirs, run_train

from kiln.core.telemetry.profile import CATEGORY_ORDER
from kiln.experiments.tracking.wandb_files import read_records, read_summary


def test_kiln_train_profile_steps_keeps_a_trace_and_a_breakdown_and_logs_them(tmp_path):
    args = [*FAST, "trainer.max_steps=7", "profile=steps", "profile.active=2", "logger=wandb"]
    proc = run_train(args, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (job,) = job_dirs(tmp_path)
    profile = json.loads((job / "summary.json").read_text())["profile"]
    assert profile["trace"] == "profile/trace.json"  # relative to the job: a moved job reads it
    assert profile["steps"] == [5, 6]  # after wait 2 and warmup 2
    events = json.loads((job / "profile" / "trace.json").read_text())["traceEvents"]
    assert sum(e.get("name", "").startswith("ProfilerStep#") for e in events) == 2
    found = profile["breakdown"]
    assert list(found["host_ms"]) == [c for c in CATEGORY_ORDER if c in found["host_ms"]]
    assert sum(found["host_ms"].values()) == pytest.approx(found["step_ms"])
    assert found["host_ms"]["matmul and linear"] > 0 and found["ops_per_step"] > 0
    # the W&B run: the breakdown in its summary, the trace folder as an artifact
    summary = read_summary(job)
    assert summary["profile/breakdown/step_ms"] == found["step_ms"]
    assert profile["wandb_artifact"].startswith("profile-")
    assert any(r["type"] == "artifact" for r in read_records(job))


def test_profiling_is_off_by_default(tmp_path, monkeypatch):
    from kiln.core.callbacks import StepProfiler

    made: list[str] = []

    def counted(cls):
        init = cls.__init__

        def __init__(self, *args, **kwargs):
            made.append(cls.__qualname__)
            init(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", __init__)

    # torch.profiler.profile builds an autograd profiler underneath: either route counts
    for cls in (StepProfiler, torch.profiler.profile, torch.autograd.profiler.profile):
        counted(cls)
    proc = run_train([*FAST, "logger=csv"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert made == []  # profiling off costs nothing: no profiler exists to cost it
    (job,) = job_dirs(tmp_path)
    assert "profile" not in json.loads((job / "summary.json").read_text())
    assert not (job / "profile").exists()


@pytest.mark.long  # a 2-job compile sweep: the report of one profiled job is tested above
def test_kiln_report_puts_a_compile_sweeps_breakdowns_side_by_side(tmp_path, capsys):
    from kiln.experiments.report.cli import build_report

    args = ["-m", *FAST, "trainer.max_steps=7", "profile=steps", "profile.active=2"]
    proc = run_train([*args, "compile=none,default", "logger=csv"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sweep = job_dirs(tmp_path)[0].parent
    report = build_report(sweep)
    out = capsys.readouterr().out
    assert "compile=none -> compile=default" in out and "ms/step" in out
    md = (sweep / "report.md").read_text()
    assert "## Where the step time goes" in md and "| matmul and linear |" in md
    assert (sweep / "profiles.png").stat().st_size > 0
    _, rows = report["tables"]["profiles"]
    assert {r["category"] for r in rows} >= {"matmul and linear", "optimizer"}
    assert all(r["pair"].startswith("compile=none -> compile=default") for r in rows)


def _profiled(compile_mode: str, precision: str, host: dict[str, float]) -> dict:
    config = {"compile": {"mode": compile_mode}, "trainer": {"precision": precision}}
    breakdown = {"step_ms": sum(host.values()), "host_ms": host, "ops_per_step": 10}
    return {
        "model": "m",
        "compile_mode": compile_mode,
        "precision": precision,
        "config": config,
        "profile": {"breakdown": breakdown},
    }


def test_profile_pairs_differ_in_one_comparisons_keys_only():
    from kiln.experiments.report.profiles import compact_line, profile_pairs

    runs = [
        _profiled("none", "32-true", {"attention": 4.0, "optimizer": 1.0}),
        _profiled("default", "32-true", {"attention": 2.0, "optimizer": 1.0}),
        _profiled("none", "bf16-mixed", {"attention": 3.0, "optimizer": 1.0}),
        _profiled("default", "bf16-mixed", {"attention": 1.0, "optimizer": 1.0}),
    ]
    pairs = profile_pairs(runs)
    titles = sorted(p.title for p in pairs)
    assert titles == [
        "compile=none -> compile=default (m)",
        "compile=none -> compile=default (m)",
        "precision=32-true -> precision=bf16-mixed (m)",
        "precision=32-true -> precision=bf16-mixed (m)",
    ]
    first = next(p for p in pairs if p.comparison == "compile")
    assert "attention 4.0 -> 2.0" in compact_line(first)
    assert "optimizer 1.0 -> 1.0" in compact_line(first)


def test_a_cuda_pair_shows_its_kernels_time_by_category_beside_the_hosts():
    from kiln.experiments.report.profiles import compact_line, markdown, profile_pairs, table_rows

    eager = _profiled("none", "bf16-mixed", {"attention": 4.0, "optimizer": 1.0})
    compiled = _profiled("default", "bf16-mixed", {"compiled regions": 2.0, "optimizer": 1.0})
    for record, kernels, gpu in ((eager, 136, {"attention": 0.2}), (compiled, 100, {})):
        record["profile"]["breakdown"] |= {"kernels_per_step": kernels, "device_ms": gpu}
    compiled["profile"]["breakdown"]["device_ms"] = {"compiled regions": 0.05}
    (pair,) = profile_pairs([eager, compiled])
    line = compact_line(pair)
    assert "kernels 136 -> 100/step (0.20 -> 0.05 kernel ms/step" in line, line
    assert "attention 0.20 -> 0.00" in line, line
    text = "\n".join(markdown([pair]))
    assert "GPU kernels by category:" in text
    assert "| all kernels | 0.20 | 0.05 | 0.25 |" in text
    assert "| kernels/step | 136 | 100 | |" in text
    rows = {r["category"]: r for r in table_rows([pair])}
    assert rows["gpu kernels: compiled regions"]["other_ms"] == 0.05
    # a CPU pair (no device_ms) has no GPU table
    cpu = [_profiled("none", "32-true", {"attention": 4.0}), _profiled("default", "32-true", {})]
    assert "GPU kernels" not in "\n".join(markdown(profile_pairs(cpu)))


class _Mlp(torch.nn.Module):
    """A contract module kiln-bench can time: a two-layer MLP's squared output."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
        )

    def training_step(self, batch, batch_idx):
        return {"loss": self.net(batch).pow(2).mean(), "num_items": batch.shape[0]}

    def configure_optimizers(self):
        return {"optimizer": torch.optim.SGD(self.parameters(), lr=0.1)}


def test_kiln_bench_profiles_its_eager_and_compiled_phases_one_trace_each(tmp_path):
    from kiln.core import CompileConfig
    from kiln.experiments.bench.harness import run_benchmark
    from kiln.experiments.report.profiles import bench_profile_pairs, compact_line

    result = run_benchmark(
        _Mlp(),
        torch.randn(4, 8),
        compile_cfg=CompileConfig(mode="default", backend="aot_eager"),
        warmup=0,
        repeats=2,
        memory_steps=0,
        profile_steps=2,
        profile_dir=tmp_path,
    )
    assert result["status"] == "pass", result.get("reason")
    for phase in ("eager", "compiled"):
        profile = result["profile"][phase]
        events = json.loads((tmp_path / f"profile_{phase}" / "trace.json").read_text())
        assert (
            sum(e.get("name", "").startswith("ProfilerStep#") for e in events["traceEvents"]) == 2
        )
        assert profile["breakdown"]["steps"] == 2
    record = {"model": "mlp", "compile_mode": "default", **result}
    (pair,) = bench_profile_pairs([record])
    assert compact_line(pair).startswith("compile=none -> compile=default (mlp)")


def _profiled_against_the_step_timer(job) -> tuple[float, float]:
    """The profile's mean step (its categories' sum) and the loop's own step timer's mean
    over the same optimizer steps (``step_times_s`` starts after ``trainer.warmup_steps``)."""
    record = json.loads((job / "summary.json").read_text())
    breakdown = record["profile"]["breakdown"]
    first, last = record["profile"]["steps"]
    warmup = record["config"]["trainer"]["warmup_steps"]
    timed = record["telemetry"]["step_times_s"][first - 1 - warmup : last - warmup]
    assert len(timed) == last - first + 1 == breakdown["steps"]
    return sum(breakdown["host_ms"].values()), 1e3 * sum(timed) / len(timed)


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["trainer.max_steps=8"], id="default-job", marks=pytest.mark.slow),
        pytest.param(
            ["debug=fast", "trainer.max_steps=10", "compile=default", "compile.backend=aot_eager"],
            id="fast-compiled",
            marks=pytest.mark.long,  # a compiled job; the profile's own test is above
        ),
    ],
)
def test_a_profiles_categories_add_up_to_the_loops_step_time(tmp_path, args):
    proc = run_train([*args, "profile=steps", "logger=wandb"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (job,) = job_dirs(tmp_path)
    categories, timed = _profiled_against_the_step_timer(job)
    assert categories == pytest.approx(timed, rel=0.10)
    # the loop's work outside its timer (the next window's data, logging) is kept apart
    profile = json.loads((job / "summary.json").read_text())["profile"]
    assert profile["breakdown"]["between_steps_ms"]["data and host-to-device copies"] > 0
    # the trace Perfetto opens: the profiled steps, aten ops and the optimizer under them
    events = json.loads((job / "profile" / "trace.json").read_text())["traceEvents"]
    names = [e.get("name", "") for e in events]
    assert sum(n.startswith("ProfilerStep#") for n in names) == 3
    assert any(n.startswith("Optimizer.step") for n in names)
    assert any(n in ("aten::addmm", "aten::mm", "aten::linear") for n in names)
    assert all({"ph", "ts", "pid", "tid"} <= e.keys() for e in events if e.get("ph") == "X")
    # the W&B run's artifact, read from the offline run's files
    artifacts = [r for r in read_records(job) if r["type"] == "artifact"]
    assert [a["artifact"]["name"] for a in artifacts] == [
        json.loads((job / "summary.json").read_text())["profile"]["wandb_artifact"]
    ]
