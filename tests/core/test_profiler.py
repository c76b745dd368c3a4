"""StepProfiler: a trace of the measured steps that opens in Perfetto, and a breakdown of a
step's time whose categories add up to the step."""

from __future__ import annotations

import json

import pytest
import torch
from toy import ToyTokenModule
from trainers import trainer_config

from kiln.core import ProfileConfig, fit
from kiln.core.callbacks import StepProfiler
from kiln.core.telemetry.profile import CATEGORY_ORDER, HOST


def test_the_profile_holds_the_measured_steps_and_a_breakdown_that_adds_up(tmp_path):
    profiler = StepProfiler(ProfileConfig(str(tmp_path / "profile"), wait=1, warmup=1, active=3))
    result = fit(
        ToyTokenModule(n=64, batch_size=4, optimizer="adamw"),
        trainer_config(max_steps=8, accumulate_grad_batches=2),
        callbacks=[profiler],
    )
    assert profiler.result is not None
    trace = json.loads((tmp_path / "profile" / "trace.json").read_text())
    names = [e.get("name", "") for e in trace["traceEvents"]]
    steps = sorted({n for n in names if n.startswith("ProfilerStep#")})
    assert len(steps) == 3  # the active steps, nothing of the wait and warmup
    assert any(n.startswith("aten::addmm") or n.startswith("aten::mm") for n in names)
    assert any(n.startswith("Optimizer.step") for n in names)
    found = profiler.result["breakdown"]
    assert found["steps"] == 3
    assert set(found["host_ms"]) <= set(CATEGORY_ORDER)
    assert sum(found["host_ms"].values()) == pytest.approx(found["step_ms"], rel=1e-6)
    for category in ("matmul and linear", "optimizer", "normalisation and elementwise", HOST):
        assert found["host_ms"].get(category, 0) > 0, category
    assert found["ops_per_step"] > 10
    # the next window's data is fetched outside the timed step, and kept apart
    assert found["between_steps_ms"]["data and host-to-device copies"] > 0
    # the profiled steps as the loop's own step timer measured them (its window excludes
    # the data fetch and logging, the profile's includes them)
    timed = result.telemetry["step_times_s"]
    assert len(timed) >= 3 and found["step_ms"] > 0


def test_a_run_too_short_for_the_profile_says_so(tmp_path, caplog):
    profiler = StepProfiler(ProfileConfig(str(tmp_path / "profile"), wait=2, warmup=2, active=3))
    fit(ToyTokenModule(), trainer_config(max_steps=3), callbacks=[profiler])
    assert profiler.result is None
    assert "before the 7 the profile needs" in caplog.text
    assert not (tmp_path / "profile" / "trace.json").exists()


def test_bad_profile_steps_are_named():
    with pytest.raises(ValueError, match="active=0"):
        ProfileConfig("x", active=0)


class _FailAt:
    """A callback that fails the run as step ``step`` ends."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_loop_start(self, fit) -> None:
        self.fit = fit

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if self.fit.global_step == self.step:
            raise RuntimeError(f"failed at step {self.step}")


@pytest.mark.parametrize(
    ("fail_at", "kept"),
    [(4, False), (9, True)],  # inside the active steps 3-5; after the profile was written
    ids=["mid-profile", "after-profile"],
)
def test_a_run_that_fails_stops_its_profiler(tmp_path, caplog, fail_at, kept):
    config = ProfileConfig(str(tmp_path / "failed"), wait=1, warmup=1, active=3)
    profiler = StepProfiler(config)
    with pytest.raises(RuntimeError, match=f"failed at step {fail_at}"):
        fit(
            ToyTokenModule(n=64, batch_size=4),
            trainer_config(max_steps=12),
            callbacks=[profiler, _FailAt(fail_at)],
        )
    assert not torch.autograd.profiler._is_profiler_enabled  # stopped with the run
    assert (tmp_path / "failed" / "trace.json").exists() is kept
    assert (profiler.result is not None) is kept
    assert ("before the profile of steps 3-5 was whole" in caplog.text) is not kept
    # the next run in this process profiles as if nothing happened
    after = StepProfiler(ProfileConfig(str(tmp_path / "next"), wait=1, warmup=1, active=2))
    fit(ToyTokenModule(n=64, batch_size=4), trainer_config(max_steps=6), callbacks=[after])
    assert after.result is not None and after.result["breakdown"]["steps"] == 2


def test_a_callback_failing_in_on_exception_leaves_the_runs_own_error(caplog):
    class Broken:
        def on_exception(self, error):
            raise ValueError("broken callback")

    with pytest.raises(RuntimeError, match="failed at step 2"):
        fit(ToyTokenModule(), trainer_config(max_steps=4), callbacks=[_FailAt(2), Broken()])
    assert "a callback's on_exception failed" in caplog.text
