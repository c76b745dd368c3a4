"""The kiln-bench harness on tiny modules: control, accuracy check, graph breaks, errors."""

import numpy as np
import pytest
import torch
from torch import nn

from kiln.core import CompileConfig
from kiln.experiments.bench.harness import disable_dropout, run_benchmark
from kiln.experiments.bench.record import BenchResult

AOT = {"backend": "aot_eager"}  # compiles in a second; inductor's speed is not the point here


class Tiny(nn.Module):
    """A contract module with dropout (so a missed dropout would break the control)."""

    def __init__(self, extra=None):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3))
        self.extra = extra

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        if self.extra is not None:
            loss = self.extra(loss)
        return {"loss": loss, "num_items": x.shape[0]}

    def configure_optimizers(self):
        return {"optimizer": torch.optim.AdamW(self.parameters(), lr=1e-3)}


def batch():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(4, 8, generator=gen), torch.randint(0, 3, (4,), generator=gen)


FAST = {"warmup": 1, "repeats": 3, "memory_steps": 1}


def test_control_is_eager_against_eager():
    result = run_benchmark(Tiny(), batch(), compile_cfg=CompileConfig(mode="none"), **FAST)
    assert result["status"] == "pass", result["reason"]
    acc = result["accuracy"]
    assert acc["loss_rel_err"] == 0.0 and acc["grad_rel_err"] == 0.0  # dropout really is off
    assert result["compile_mode"] == "none" and result["graph_breaks"] == 0
    assert len(result["eager_times_s"]) == len(result["compiled_times_s"]) == 3
    assert result["speedup"] == pytest.approx(
        result["eager_median_s"] / result["compiled_median_s"]
    )
    ratios = np.divide(result["eager_times_s"], result["compiled_times_s"])  # per pair
    assert result["speedup_p25"] == pytest.approx(np.percentile(ratios, 25))
    assert result["speedup_p75"] == pytest.approx(np.percentile(ratios, 75))


def test_compiled_matches_eager():
    result = run_benchmark(
        Tiny(), batch(), compile_cfg=CompileConfig(mode="default", **AOT), **FAST
    )
    assert result["status"] == "pass", result["reason"]
    assert result["accuracy"]["grad_rel_err"] <= 1e-4
    assert result["compile_time_s"] > 0 and result["dynamo_compile_time_s"] > 0
    assert result["graph_breaks"] == 0 and result["recompiles"] == 0
    assert result["memory_eager_mb"] > 0 and result["memory_compiled_mb"] > 0
    # every key the type names but the error, control and profile ones
    assert set(result) == BenchResult.__optional_keys__ - {"traceback", "noisy_machine", "profile"}


def test_bf16_mixed_within_its_tolerance():
    result = run_benchmark(
        Tiny(),
        batch(),
        precision="bf16-mixed",
        compile_cfg=CompileConfig(mode="default", **AOT),
        **FAST,
    )
    assert result["status"] == "pass", result["reason"]
    assert result["accuracy"]["tolerance"] == pytest.approx(2e-2)


def test_graph_breaks_are_counted():
    def side_effect(loss):
        print("a graph break")  # dynamo cannot trace print: the graph splits here
        return loss * 1.0

    result = run_benchmark(
        Tiny(side_effect), batch(), compile_cfg=CompileConfig(mode="default", **AOT), **FAST
    )
    assert result["status"] == "pass", result["reason"]
    assert result["graph_breaks"] >= 1
    assert result["graph_break_reasons"]


def test_accuracy_mismatch_is_a_fail_row():
    def differs_when_compiled(loss):
        return loss * 1.5 if torch.compiler.is_compiling() else loss

    result = run_benchmark(
        Tiny(differs_when_compiled),
        batch(),
        compile_cfg=CompileConfig(mode="default", **AOT),
        **FAST,
    )
    assert result["status"] == "fail"
    assert result["reason"].startswith("accuracy:")
    assert result["accuracy"]["loss_rel_err"] == pytest.approx(0.5)
    assert result["speedup"] is not None  # timed all the same


def test_an_exception_is_an_error_row():
    def boom(loss):
        raise RuntimeError("model exploded")

    result = run_benchmark(Tiny(boom), batch(), compile_cfg=CompileConfig(mode="none"), **FAST)
    assert result["status"] == "error"
    assert "first step" in result["reason"] and "model exploded" in result["reason"]
    assert set(result) < BenchResult.__optional_keys__  # the type names every key written


def test_fp16_amp_needs_cuda():
    if torch.cuda.is_available():
        pytest.skip("checks the CPU refusal")
    result = run_benchmark(Tiny(), batch(), precision="16-mixed", **FAST)
    assert result["status"] == "error" and "needs a CUDA device" in result["reason"]


def test_disable_dropout_covers_modules_and_float_attributes():
    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_dropout = 0.1  # HF style: used as F.sdpa(dropout_p=...)
            self.drop = nn.Dropout(0.2)
            self.drop_prob = 0.3  # timm DropPath
            self.num_heads = 4

    module = disable_dropout(Attention())
    assert module.attention_dropout == 0.0 and module.drop.p == 0.0 and module.drop_prob == 0.0
    assert module.num_heads == 4
