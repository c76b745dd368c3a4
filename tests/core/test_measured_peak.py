"""kiln.core.telemetry.machine.measured_peak: the machine's own matmul plateau."""

import pytest

from kiln.core.telemetry import machine
from kiln.core.telemetry.machine import measured_peak


def test_the_peak_grows_the_matmul_until_its_rate_stops_growing(monkeypatch):
    """Fake rates per size: 256 -> 10, 512 -> 40, 1024 -> 42 GFLOP/s (under 1.1x: the
    plateau), 2048 never tried."""
    rates = {256: 10.0, 512: 40.0, 1024: 42.0, 2048: 1000.0}
    tried: list[int] = []

    def fake_rate(work, budget_s, sync):
        size = tried[-1]
        return rates[size] * 1e9 / (2 * size**3), 3

    import torch

    ones = torch.ones

    def sized_ones(size, *args, **kwargs):
        tried.append(size)
        return ones(2, 2, **kwargs)

    monkeypatch.setattr(machine, "_rate", fake_rate)
    monkeypatch.setattr(torch, "ones", sized_ones)
    monkeypatch.setitem(machine.PEAK_SIZES, "cpu", (256, 512, 1024, 2048))
    peak = measured_peak("cpu", "32-true")
    assert tried == [256, 512, 1024]
    assert peak == {
        "matmul_peak_gflop_per_s": 42.0,
        "matmul_peak_size": 1024,
        "matmul_dtype": "float32",
    }


@pytest.mark.parametrize(
    ("precision", "dtype"), [("32-true", "float32"), ("bf16-mixed", "bfloat16")]
)
def test_the_peak_is_measured_at_the_runs_precision(precision, dtype):
    peak = measured_peak("cpu", precision, budget_s=0.02)
    assert peak["matmul_dtype"] == dtype and peak["matmul_peak_gflop_per_s"] > 0
    assert peak["matmul_peak_size"] in machine.PEAK_SIZES["cpu"]


@pytest.mark.parametrize(
    ("rates", "tried", "peak"),
    [
        # a copy in the caches runs fast; memory's rate is where two sizes agree
        ({16: 90.0, 64: 20.0, 256: 19.0, 1024: 1.0}, [16, 64, 256], 19.0),
        ({16: 20.0, 64: 21.0, 256: 90.0, 1024: 1.0}, [16, 64], 21.0),
        ({16: 90.0, 64: 40.0, 256: 20.0}, [16, 64, 256], 20.0),  # no plateau: the largest
    ],
    ids=["cache-then-memory", "plateau-at-once", "largest-size"],
)
def test_the_bandwidth_grows_the_copy_until_two_sizes_agree(monkeypatch, rates, tried, peak):
    import torch

    from kiln.core.telemetry.machine import measured_bandwidth

    sizes: list[int] = []
    ones = torch.ones

    def sized_ones(numel, *args, **kwargs):
        sizes.append(numel // 2**18)  # float32 elements per MiB
        return ones(4, **kwargs)

    def fake_rate(work, budget_s, sync):
        mb = sizes[-1]
        return rates[mb] * 1e9 / (2 * mb * 2**20), 3

    monkeypatch.setattr(machine, "_rate", fake_rate)
    monkeypatch.setattr(torch, "ones", sized_ones)
    monkeypatch.setitem(machine.COPY_SIZES_MB, "cpu", tuple(rates))
    found = measured_bandwidth("cpu")
    assert sizes == tried
    assert found == {"copy_peak_gb_per_s": peak, "copy_peak_mb": tried[-1]}


def test_the_bandwidth_is_measured_on_this_machine():
    from kiln.core.telemetry.machine import measured_bandwidth

    found = measured_bandwidth("cpu", budget_s=0.02)
    assert found["copy_peak_gb_per_s"] > 0
    assert found["copy_peak_mb"] in machine.COPY_SIZES_MB["cpu"]
