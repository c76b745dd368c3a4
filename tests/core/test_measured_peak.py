"""kiln.core.telemetry.machine.measured_peak: the machine's own matmul plateau."""

import pytest

from kiln.core import measured_peak
from kiln.core.telemetry import machine


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
