import math
import os
import warnings
from pathlib import Path

import pytest
import torch

from kiln.core.telemetry.compile_watch import CompileWatch
from kiln.core.telemetry.memory import device_peak_memory_mb
from kiln.core.telemetry.step_timer import StepTimer


def test_step_timer_summary_over_steps_after_warmup():
    timer = StepTimer()
    for seconds in (5.0, 4.0):  # warm-up: compilation, caches
        timer.record(seconds, samples=8, tokens=100)
    for seconds in (1.0, 2.0, 3.0, 4.0, 10.0):
        timer.record(seconds, samples=8, tokens=80)
    summary = timer.summary(warmup_steps=2)
    assert summary["measured_steps"] == 5
    assert summary["step_time_median_s"] == pytest.approx(3.0)
    assert summary["step_time_iqr_s"] == pytest.approx(4.0 - 2.0)
    assert summary["samples_per_s"] == pytest.approx(40 / 20)
    assert summary["tokens_per_s"] == pytest.approx(400 / 20)


def test_step_timer_tokens_only_from_counted_steps_and_absent_without_any():
    timer = StepTimer()
    timer.record(1.0, samples=4, tokens=None)
    timer.record(3.0, samples=4, tokens=30)
    summary = timer.summary(warmup_steps=0)
    assert summary["tokens_per_s"] == pytest.approx(10.0)
    assert summary["samples_per_s"] == pytest.approx(2.0)

    no_tokens = StepTimer()
    no_tokens.record(2.0, samples=4)
    assert "tokens_per_s" not in no_tokens.summary(0)


def test_step_timer_padding_covers_the_measured_steps_that_counted_it():
    timer = StepTimer()
    for padding in ((90, 100), (5, 100), None, (15, 100)):  # the first is warm-up
        timer.count_padding(padding)
        timer.start()
        timer.stop(samples=4)
    assert timer.measured_padding(warmup_steps=1) == (20, 200)
    assert timer.measured_padding(warmup_steps=0) == (110, 300)
    assert StepTimer().measured_padding(0) is None


def test_recent_throughput_covers_the_last_steps():
    timer = StepTimer()
    assert timer.recent_samples_per_s(10) is None
    for seconds in (10.0, 1.0, 1.0):
        timer.record(seconds, samples=4)
    assert timer.recent_samples_per_s(2) == pytest.approx(8 / 2)
    assert timer.recent_samples_per_s(100) == pytest.approx(12 / 12)
    with pytest.raises(ValueError, match="steps=0"):
        timer.recent_samples_per_s(0)


def test_step_timer_falls_back_when_shorter_than_warmup():
    timer = StepTimer()
    assert timer.summary(3) == {
        "step_time_median_s": None,
        "step_time_iqr_s": None,
        "samples_per_s": None,
        "measured_steps": 0,
    }
    timer.record(2.0, samples=6)
    timer.record(4.0, samples=6)
    summary = timer.summary(warmup_steps=3)
    assert summary["measured_steps"] == 2  # all steps, rather than nothing
    assert summary["step_time_median_s"] == pytest.approx(3.0)
    assert summary["samples_per_s"] == pytest.approx(2.0)
    assert len(timer) == 2
    with pytest.raises(ValueError, match="seconds=-1"):
        timer.record(-1, samples=1)


def test_peak_memory_on_cpu_is_the_process_peak_rss():
    # The peak may already be far above today's RSS (earlier tests; Linux keeps it across
    # exec, so a child process inherits it): touch enough memory to pass it.
    before = device_peak_memory_mb(torch.device("cpu"))
    statm = Path("/proc/self/statm")
    if not statm.exists():
        pytest.skip("needs /proc/self/statm (Linux) to read the current RSS")
    rss_mb = int(statm.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    big = torch.ones(int((max(before - rss_mb, 0) + 256) * 2**20 / 4))  # touched
    after = device_peak_memory_mb(torch.device("cpu"))
    del big
    assert before > 10  # the interpreter and torch alone
    assert after >= before + 128


def test_recompiles_are_counted_and_the_warning_names_the_changed_size():
    watch = CompileWatch(threshold=2)
    watch.start()

    @torch.compile(backend="aot_eager", dynamic=False)
    def double_sum(x):
        return (x * 2).sum()

    for rows in (2, 3, 2):
        double_sum(torch.randn(rows, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        watch.check()  # one recompile: below the threshold, no warning
    double_sum(torch.randn(5, 3))
    with pytest.warns(UserWarning) as record:
        watch.check()
        watch.check()  # warns once
    assert len(record) == 1
    message = str(record[0].message)
    assert "recompiled 2 times" in message
    assert "double_sum" in message
    # compared with the most recently used compiled entry (rows=2)
    assert "tensor 'x' size mismatch at index 0. expected 2, actual 5" in message

    snapshot = watch.snapshot()
    assert snapshot["recompiles"] == 2
    # the first recompiles, each with dynamo's guard failure: what changed
    assert len(snapshot["recompile_reasons"]) == 2
    assert all(r.startswith("double_sum (") for r in snapshot["recompile_reasons"])
    assert "size mismatch at index 0. expected 2, actual 3" in snapshot["recompile_reasons"][0]
    assert snapshot["unique_graphs"] == 3
    assert snapshot["graph_breaks"] == 0
    assert snapshot["compile_time_s"] > 0


def test_recompiles_while_validating_are_counted_apart():
    """The loop's validation runs without grad: the graph it compiles is a recompile by
    dynamo's count, told apart (count and reason) from a recompile while training."""
    watch = CompileWatch(threshold=8)
    watch.start()
    linear = torch.nn.Linear(3, 3)
    step = torch.compile(lambda x: linear(x).sum(), backend="aot_eager", dynamic=False)
    step(torch.randn(2, 3)).backward()
    with watch.validating(), torch.no_grad():
        step(torch.randn(2, 3))  # grad mode changed: a recompile, validation's
        step(torch.randn(2, 3))  # cached: nothing more
    step(torch.randn(4, 3)).backward()  # a new shape while training
    snapshot = watch.snapshot()
    assert (snapshot["recompiles"], snapshot["validation_recompiles"]) == (2, 1), snapshot
    first, second = snapshot["recompile_reasons"]
    assert first.startswith("validation: ") and "grad_mode" in first, first
    assert second.startswith("<lambda> ("), second  # training's


def test_graph_breaks_are_counted_with_reasons():
    watch = CompileWatch(threshold=8)
    watch.start()
    linear = torch.nn.Linear(3, 3)

    def broken(x):
        y = linear(x).relu()
        torch._dynamo.graph_break()
        return y.sum()

    torch.compile(broken, backend="aot_eager")(torch.randn(4, 3)).backward()
    snapshot = watch.snapshot()
    assert snapshot["graph_breaks"] == 1
    assert snapshot["unique_graphs"] == 2  # before and after the break
    assert snapshot["recompiles"] == 0
    assert any("graph_break()" in reason for reason in snapshot["graph_break_reasons"])
    assert all("\n" not in reason for reason in snapshot["graph_break_reasons"])

    watch.start()  # a fresh start forgets the previous figures
    assert watch.snapshot() == {
        "compile_time_s": 0.0,
        "recompiles": 0,
        "validation_recompiles": 0,
        "graph_breaks": 0,
        "unique_graphs": 0,
        "graph_break_reasons": [],
        "graph_break_sites": [],
        "recompile_reasons": [],
        "compiled_blocks": 0,
        "compile_cache": None,  # nothing compiled: no on-disk cache was asked
        "fx_graph_cache_hits": 0,
        "fx_graph_cache_misses": 0,
        "aot_autograd_cache_hits": 0,
        "aot_autograd_cache_misses": 0,
    }


def test_every_graph_break_has_its_reason_and_user_source_line(capfd):
    """A data-dependent branch breaks the graph too; dynamo's ``graph_break`` counter misses
    it (``graph_break_reasons`` read ``[]``): the watch reads dynamo's graph-break log."""
    watch = CompileWatch(threshold=8)
    watch.start()

    def branchy(x):
        y = x * 2
        if y.sum() > 0:  # data-dependent control flow: a graph break
            y = y + 1
        return y.sin().sum()

    line = branchy.__code__.co_firstlineno + 2
    torch.compile(branchy, backend="eager")(torch.ones(3))
    snapshot = watch.snapshot()
    assert snapshot["graph_breaks"] == 1
    (reason,) = snapshot["graph_break_reasons"]
    assert reason.startswith("Data-dependent branching")
    assert reason.endswith(f"(at {Path(__file__).name}:{line})")
    assert snapshot["graph_break_sites"] == [f"{__file__}:{line}"]
    assert "Graph break in user code" not in capfd.readouterr().err  # recorded, not printed


def test_compile_time_is_read_from_torch_records_and_survives_their_rotation(monkeypatch):
    watch = CompileWatch(threshold=8)
    watch.start()

    @torch.compile(backend="aot_eager")
    def add_one(x):
        return x + 1

    add_one(torch.ones(2))
    first = watch.snapshot()["compile_time_s"]
    records = torch._dynamo.utils.get_compilation_metrics()
    assert first == pytest.approx(sum(r.duration_us for r in records) / 1e6)
    assert watch.snapshot()["compile_time_s"] == first  # records are not counted twice
    with pytest.raises(ValueError, match="threshold=0"):
        CompileWatch(0)


def test_step_timer_times_steps_and_records_them_at_the_sync_point():
    timer = StepTimer(torch.device("cpu"))
    for tokens in (7, torch.tensor(9.0, dtype=torch.float64), None):
        timer.start()
        timer.stop(samples=4, tokens=tokens)
    assert len(timer) == 0  # nothing read before the sync point
    timer.sync()
    assert len(timer) == 3
    assert timer._tokens[:2] == [7.0, 9.0] and math.isnan(timer._tokens[2])
    assert all(s >= 0 for s in timer._seconds)
    with pytest.raises(RuntimeError, match=r"without a StepTimer.start"):
        timer.stop(samples=1)


def test_measured_step_times_are_the_summarized_ones_thinned_past_the_limit():
    timer = StepTimer()
    for i in range(25):
        timer.record(float(i), samples=1)
    assert timer.measured_times(5) == [float(i) for i in range(5, 25)]
    assert len(timer.measured_times(5)) == timer.summary(5)["measured_steps"]
    assert timer.measured_times(5, limit=8) == [float(i) for i in range(5, 25, 3)]
    assert timer.measured_times(30) == [float(i) for i in range(25)]  # as summary: all


def test_a_runs_telemetry_holds_its_measured_step_times():
    from toy import ToyTokenModule

    from kiln.core import TrainerConfig, fit

    trainer = TrainerConfig(max_steps=8, warmup_steps=3, accelerator="cpu", progress=False)
    telemetry = fit(ToyTokenModule(n=32, batch_size=2), trainer).telemetry
    times = telemetry["step_times_s"]
    assert len(times) == telemetry["measured_steps"] == 5
    assert telemetry["step_time_median_s"] == pytest.approx(sorted(times)[2])
