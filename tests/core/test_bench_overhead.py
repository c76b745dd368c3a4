"""scripts/bench_overhead.py: kiln's loop, a naive Fabric loop and a plain PyTorch loop train
identically (so the script times the same work three ways)."""

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_overhead.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_overhead", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_kiln_and_plain_loops_end_with_bit_identical_weights(bench):
    cfg = bench.BenchConfig(steps=6, warmup=1, batch_size=8, in_features=16, width=32)
    result = bench.compare(cfg, repeats=1)
    assert result["identical"] is True
    assert len(result["fabric_runs_s"]) == 1 and result["fabric_step_s"] > 0
    # one round: each ratio is the quotient of that round's step times
    assert result["ratio"] == pytest.approx(result["kiln_step_s"] / result["plain_step_s"])
    assert result["vs_fabric"] == pytest.approx(result["kiln_step_s"] / result["fabric_step_s"])
    assert result["sampler_ratio"] == pytest.approx(
        result["kiln_step_s"] / result["kiln-unsampled_step_s"]
    )


def test_weights_differ_when_the_training_differs(bench):
    cfg = bench.BenchConfig(steps=4, warmup=1, batch_size=8, in_features=16, width=32)
    plain = bench.train_plain(cfg)
    assert bench.same_weights(plain, bench.train_kiln(cfg))
    assert bench.same_weights(plain, bench.train_fabric(cfg))
    assert bench.same_weights(plain, bench.train_kiln_unsampled(cfg))
    other = bench.train_plain(bench.BenchConfig(**{**vars(cfg), "lr": 0.01}))
    assert not bench.same_weights(plain, other)
