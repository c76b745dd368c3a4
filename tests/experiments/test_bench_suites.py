"""PyTorch's benchmark suites in kiln-bench: the lists, the models built from config (no
weights), sweeps that make a model kiln cannot build a row, and the seed's table."""

import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from in_process import kiln_command

from kiln.experiments.bench.bench_config import register_configs
from kiln.experiments.bench.suites import SuiteModelUnsupported, build_suite_module
from kiln.experiments.report.bench import model_rows, suite_rows, summary_rows
from kiln.experiments.report.cli import build_report
from kiln.experiments.settings.compose import config_dir
from kiln.experiments.settings.suite_lists import (
    list_batch_sizes,
    source_revision,
    suite_batch_size,
    sweep_values,
)

CPU = torch.device("cpu")
LLM_ENTRIES = {name for name in list_batch_sizes("hf") if "/" in name}


def test_lists_are_pytorchs_with_their_batch_sizes_and_revision():
    hf, timm = list_batch_sizes("hf"), list_batch_sizes("timm")
    assert len(hf) == 55 and len(timm) == 18  # the lists at the commits read
    assert hf["AlbertForMaskedLM"] == 8 and hf["mistralai/Mistral-7B-Instruct-v0.3"] == 8
    assert timm["ghostnet_100"] == 512 and timm["adv_inception_v3"] == 128
    assert "0fb2b95fb850e8cdedc2379ca3911a537c1ec3b9" in source_revision("hf")
    assert "06d9861d519786d1c5dc0477994df380ff077240" in source_revision("timm")
    # a training run divides by the harness's divisors (huggingface.yaml, timm_models.yaml)
    assert suite_batch_size("hf", "AlbertForMaskedLM") == 4
    assert suite_batch_size("hf", "BertForQuestionAnswering") == 32
    assert suite_batch_size("timm", "swin_base_patch4_window7_224") == 64
    with pytest.raises(ValueError, match=r"'resnet18' is not in the timm suite"):
        suite_batch_size("timm", "resnet18")
    assert sweep_values("timm").split(",")[0] == "'adv_inception_v3'"


def test_sweep_presets_sweep_the_whole_lists():
    register_configs()
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        for sweep, suite in (("pt2_hf", "hf"), ("pt2_timm", "timm")):
            cfg = compose("bench", overrides=[f"sweep={sweep}"], return_hydra_config=True)
            assert cfg.model.name == "pt2" and cfg.model.suite == suite
            assert cfg.bench.batch_size is None  # the list's (or the small variant's)
            params = cfg.hydra.sweeper.params
            names = [n.strip("'") for n in params["model.arch"].split(",")]
            assert names == list(list_batch_sizes(suite))
            assert params.precision == "32-true,bf16-mixed"


@pytest.mark.parametrize("name", list(list_batch_sizes("hf")))
def test_every_small_hf_model_builds_and_trains_a_step(name):
    if name in LLM_ENTRIES:  # pretrained-only generate() benchmarks: a row with the reason
        with pytest.raises(SuiteModelUnsupported, match="LLM entry"):
            build_suite_module({"name": "pt2", "suite": "hf", "arch": name}, CPU)
        return
    module = build_suite_module({"name": "pt2", "suite": "hf", "arch": name, "size": "auto"}, CPU)
    assert module.size == "small" and module.default_batch_size == 2 and module.seq_len == 32
    assert module.describe()["parameters"] < 2_000_000  # the CPU variant is small
    batch = module.example_batch()
    assert batch["input_ids"].shape == (2, 32)
    loss = module.training_step(batch, 0)["loss"]
    loss.backward()
    assert torch.isfinite(loss)
    assert any(p.grad is not None for p in module.parameters())


@pytest.mark.parametrize("name", ["deit_tiny_patch16_224.fb_in1k", "mobilenetv2_100"])
def test_small_timm_models_build_and_train_a_step(name):
    module = build_suite_module({"name": "pt2", "suite": "timm", "arch": name}, CPU)
    assert module.input_size == (3, 64, 64) and module.default_batch_size == 2
    loss = module.training_step(module.example_batch(), 0)["loss"]
    loss.backward()
    assert torch.isfinite(loss)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(list_batch_sizes("timm")))
def test_every_small_timm_model_builds_and_trains_a_step(name):
    module = build_suite_module({"name": "pt2", "suite": "timm", "arch": name}, CPU)
    loss = module.training_step(module.example_batch(), 0)["loss"]
    loss.backward()
    assert torch.isfinite(loss)


def test_suite_size_is_pytorchs():
    module = build_suite_module(
        {"name": "pt2", "suite": "hf", "arch": "BertForQuestionAnswering", "size": "suite"}, CPU
    )
    assert module.default_batch_size == 32 and module.seq_len == 512  # the harness's
    assert module.model.config.num_hidden_layers == 12  # BertConfig() defaults: bert-base
    assert module.example_batch(1)["start_positions"].shape == (1,)


def test_bad_suite_model_config_names_what_is_valid():
    with pytest.raises(ValueError, match=r"model.suite='torchbench' is not valid"):
        build_suite_module({"name": "pt2", "suite": "torchbench", "arch": "x"}, CPU)
    with pytest.raises(ValueError, match=r"model.size='tiny' is not valid"):
        build_suite_module({"name": "pt2", "suite": "hf", "arch": "T5Small", "size": "tiny"}, CPU)
    with pytest.raises(ValueError, match=r"no argument\(s\) \['layers'\]"):
        build_suite_module({"name": "pt2", "suite": "hf", "arch": "T5Small", "layers": 1}, CPU)


def _sweep(tmp_path: Path, sweep: str, archs: str) -> list[dict]:
    """``kiln-bench -m sweep=<sweep> model.arch=<archs>`` as a user runs it (aot_eager)."""
    out = tmp_path / sweep
    env = {"WANDB_MODE": "offline", "KILN_LOG_DIR": str(tmp_path)}
    args = [
        "-m",
        f"sweep={sweep}",
        f"model.arch={archs}",
        "precision=32-true",
        "compile.backend=aot_eager",
        "bench.repeats=2",
        "bench.warmup=0",
        "bench.memory_steps=0",
        "logger=csv",
        f"hydra.sweep.dir={out}",
    ]
    proc = kiln_command("bench", args, env)
    # the sweep finishes every job; it exits 1 because a job errored
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(p.read_text()) for p in sorted(out.glob("*/bench.json"))]


@pytest.mark.long  # about 13 s; the timm sweep proves the suites in the fast tier
def test_hf_sweep_runs_and_an_unbuildable_model_is_a_row(tmp_path):
    records = _sweep(tmp_path, "pt2_hf", "BertForMaskedLM,T5Small,'Qwen/Qwen3-0.6B'")
    by_model = {r["model"]: r for r in records}
    assert set(by_model) == {"pt2:BertForMaskedLM", "pt2:T5Small", "pt2:Qwen/Qwen3-0.6B"}
    for name in ("pt2:BertForMaskedLM", "pt2:T5Small"):
        record = by_model[name]
        assert record["status"] == "pass", record["reason"]
        assert record["suite"] == "hf" and record["suite_size"] == "small"
        assert record["batch_size"] == 2 and record["seq_len"] == 32
        assert record["speedup"] > 0 and record["accuracy"]["ok"]
        assert "0fb2b95f" in record["suite_source"]
    llm = by_model["pt2:Qwen/Qwen3-0.6B"]
    assert llm["status"] == "error" and llm["suite"] == "hf"
    assert llm["reason"].startswith("build model: SuiteModelUnsupported: an LLM entry")

    report = build_report(tmp_path / "pt2_hf", show=False)
    (row,) = report["tables"]["bench_suites"][1]
    assert row["suite"] == "hf" and row["models"] == 3
    assert row["fp32_pass_rate"] == pytest.approx(2 / 3)
    speedups = [by_model[n]["speedup"] for n in ("pt2:BertForMaskedLM", "pt2:T5Small")]
    assert row["fp32_speedup"] == pytest.approx((speedups[0] * speedups[1]) ** 0.5)
    assert "## PyTorch 2 suites" in (tmp_path / "pt2_hf" / "report.md").read_text()


def test_timm_sweep_runs_and_a_name_not_in_the_list_is_a_row(tmp_path):
    records = _sweep(tmp_path, "pt2_timm", "deit_tiny_patch16_224.fb_in1k,resnet18")
    by_model = {r["model"]: r for r in records}
    deit = by_model["pt2:deit_tiny_patch16_224.fb_in1k"]
    assert deit["status"] == "pass", deit["reason"]
    assert deit["suite"] == "timm" and deit["input_size"] == [3, 64, 64]
    unknown = by_model["pt2:resnet18"]
    assert unknown["status"] == "error"
    assert "'resnet18' is not in the timm suite" in unknown["reason"]


def _record(suite, model, precision, status, speedup, compile_s, memory_ratio):
    return {
        "suite": suite,
        "model": model,
        "compile_mode": "default",
        "precision": precision,
        "status": status,
        "speedup": speedup,
        "significant": False,
        "compile_time_s": compile_s,
        "memory_ratio": memory_ratio,
        "reason": None if status == "pass" else "why",
    }


def test_seed_table_geomean_over_passing_models_and_pass_rate():
    records = [
        _record("hf", "a", "32-true", "pass", 1.5, 10.0, 0.8),
        _record("hf", "b", "32-true", "pass", 1.2, 20.0, 0.5),
        _record("hf", "c", "32-true", "fail", 9.0, 99.0, 9.0),  # fails accuracy: not counted
        _record("hf", "d", "32-true", "error", None, None, None),
        _record("hf", "a", "16-mixed", "pass", 2.0, 12.0, 0.6),
        _record("hf", "b", "16-mixed", "pass", 1.6, 14.0, 0.4),
        _record("hf", "c", "16-mixed", "pass", 1.0, 16.0, 0.9),
        _record("hf", "d", "16-mixed", "error", None, None, None),
        _record("timm", "x", "32-true", "pass", 1.1, 5.0, 1.0),
        _record(None, "bert-tiny-cls", "32-true", "pass", 3.0, 1.0, 1.0),  # no suite: not here
    ]
    rows = suite_rows(summary_rows(model_rows(records)))
    assert [(r["suite"], r["amp"]) for r in rows] == [("hf", "16-mixed"), ("timm", None)]
    hf, timm = rows
    # by hand: FP32 sqrt(1.5 * 1.2) = 1.3416..., AMP (2.0 * 1.6 * 1.0) ** (1/3) = 1.4736...
    assert hf["fp32_speedup"] == pytest.approx(1.341640786)
    assert hf["amp_speedup"] == pytest.approx(1.473612599)
    assert hf["fp32_pass_rate"] == 0.5 and hf["amp_pass_rate"] == 0.75 and hf["models"] == 4
    assert hf["fp32_compile_time_s"] == pytest.approx(15.0)  # mean over passing models
    assert hf["amp_compile_time_s"] == pytest.approx(14.0)
    assert hf["fp32_memory_ratio"] == pytest.approx(0.632455532)  # sqrt(0.8 * 0.5)
    assert hf["amp_memory_ratio"] == pytest.approx((0.6 * 0.4 * 0.9) ** (1 / 3))
    assert timm["fp32_speedup"] == pytest.approx(1.1) and timm["amp_speedup"] is None
