"""kiln.experiments.report.watched and verdict: each rule over a run's measured window, fed
known series (two records alike in everything but the series)."""

from __future__ import annotations

import copy
import re
from typing import Any

import numpy as np
import pytest

from kiln.experiments.bench.stats import block_ratio_interval, bootstrap_ratio_interval
from kiln.experiments.report.comparable import verdict
from kiln.experiments.report.watched import drift_reason, run_reasons

WINDOWS, STEPS_PER_WINDOW = 20, 100  # window i covers steps 100 i + 1 .. 100 (i + 1)
CALIBRATION = {"matmul_dtype": "float32", "matmul_gflop_per_s": 50.0, "copy_gb_per_s": 10.0}
MACHINE = {
    "hostname": "box",
    "cpu_model": "cpu",
    "affinity_cores": 4,
    "threads_per_rank": 4,
    "gpu_names": [],
    "gpu_driver": None,
    "torch": "2.x",
    "calibration_before": CALIBRATION,
    "calibration_after": CALIBRATION,
    "load_start": {"other_cpu_cores": 0.0},
    "load_end": {"other_cpu_cores": 0.0},
}


def _times(seed: int = 0, n: int = 2000, ms: float = 10.0) -> list[float]:
    rng = np.random.default_rng(seed)
    return list(ms / 1e3 * (1 + 0.02 * rng.standard_normal(n)))


def _record(
    others: dict[int, float] | None = None,
    own: dict[int, float] | None = None,
    clocks: dict[int, int] | None = None,
    throttle: int = 0,
    times: list[float] | None = None,
    measured_from: int = 3,
) -> dict[str, Any]:
    """A run of 2000 steps sampled in 20 windows: ``others``/``own``/``clocks`` override the
    idle values (0.0 other cores, 1.0 own core, no GPU) of the windows they name."""
    samples: dict[str, list[Any]] = {
        "t_s": [float(i) for i in range(WINDOWS)],
        "seconds": [1.0] * WINDOWS,
        "step_start": [i * STEPS_PER_WINDOW for i in range(WINDOWS)],
        "step_end": [(i + 1) * STEPS_PER_WINDOW for i in range(WINDOWS)],
        "other_cpu_cores": [(others or {}).get(i, 0.0) for i in range(WINDOWS)],
        "own_cpu_cores": [(own or {}).get(i, 1.0) for i in range(WINDOWS)],
    }
    if clocks is not None:
        samples["sm_clock_mhz"] = [clocks.get(i, 1980) for i in range(WINDOWS)]
        samples["throttle_reasons"] = [throttle if i in clocks else 0 for i in range(WINDOWS)]
    times = _times() if times is None else times
    return {
        "machine": copy.deepcopy(MACHINE),
        "telemetry": {
            "step_times_s": times,
            "measured_steps": len(times),
            "machine_series": {
                "interval_s": 1.0,
                "measured_from_step": measured_from,
                "samples": samples,
            },
        },
    }


def test_two_idle_runs_are_a_result():
    assert verdict(_record(), _record()) is None


def test_others_using_a_core_for_the_middle_of_a_run_name_the_steps():
    busy = _record(others={i: 1.9 for i in range(4, 13)})
    said = verdict(_record(), busy) or ""
    assert said.startswith("confounded: others used 1.9 cores during steps 401-1300 of the base"), (
        said
    )
    assert "others used" in (verdict(busy, _record()) or "") and "of this run" in (
        verdict(busy, _record()) or ""
    )
    # under a core, and a burst only during the warm-up, are not news
    assert verdict(_record(), _record(others={5: 0.6})) is None
    assert verdict(_record(), _record(others={0: 3.0}, measured_from=150)) is None


def test_the_job_getting_less_of_its_cores_names_the_steps():
    starved = _record(own={5: 0.4, 6: 0.4, 7: 0.4})
    said = verdict(starved, _record()) or ""
    assert "the job got 0.4 of its usual 1.0 cores during steps 501-800 of this run" in said, said
    assert verdict(_record(own={5: 0.4}), _record()) is None  # one window: a checkpoint, say


def test_a_clock_that_fell_names_the_steps_and_why():
    hot = _record(clocks={10: 1200, 11: 1300}, throttle=0x20)
    said = verdict(_record(clocks={}), hot) or ""
    assert "SM clock fell to 1200 MHz (from 1980; thermal) during steps 1001-1200 of the base" in (
        said
    ), said
    assert verdict(_record(clocks={}), _record(clocks={3: 1900})) is None  # within 10%


def test_a_level_shift_within_a_run_is_drift_and_noise_is_not():
    shifted = _times(1, 1000, 10.0) + _times(2, 1000, 12.0)
    said = drift_reason(_record(times=shifted)["telemetry"], "this run") or ""
    assert re.match(
        r"step time moved from (9.9\d|10) ms \(steps 4-403\) to 12 ms \(steps 1604-2003\)", said
    ), said
    assert drift_reason(_record()["telemetry"], "this run") is None
    said = verdict(_record(times=shifted), _record()) or ""
    assert said.startswith("drift: step time moved") and "this run" in said, said  # a result
    busy = verdict(_record(times=shifted, others={2: 3.8, 3: 3.8}), _record()) or ""
    assert busy.startswith("confounded: others used 3.8 cores"), busy
    assert "step time moved" not in busy  # a drift is no reason to refuse a ratio


def test_the_slow_steps_are_counted_beside_a_window():
    times = _times()
    times[500:529] = [0.05] * 29  # a burst of 29 slow steps
    reasons = run_reasons(_record(times=times, others={2: 3.8, 3: 3.8})["telemetry"], "this run")
    assert reasons == [
        "others used 3.8 cores during steps 201-400 of this run",
        "29 steps over 20 ms in this run",
    ]
    assert run_reasons(_record(times=times)["telemetry"], "this run") == []  # no window: noise


def test_blocks_widen_the_interval_of_a_run_whose_level_moved_for_a_stretch():
    """300 consecutive steps at 11 ms among 700 at 10 ms: single-step resampling scatters
    the stretch as if its steps were independent and gives a tight interval; moving blocks
    keep it together and give a much wider one."""
    run = _times(0, 700)
    run[400:400] = _times(1, 300, 11.0)
    steady = _times(3, 1000)
    single = bootstrap_ratio_interval(run, steady)
    blocks = block_ratio_interval(run, steady)
    assert blocks[1] - blocks[0] > 2 * (single[1] - single[0]), (single, blocks)


@pytest.mark.parametrize("column", ["other_cpu_cores", "own_cpu_cores"])
def test_a_series_without_a_column_says_nothing_of_it(column):
    record = _record(others={5: 2.0, 6: 2.0}, own={5: 0.1, 6: 0.1})
    del record["telemetry"]["machine_series"]["samples"][column]
    assert verdict(record, _record()) is not None  # the other rule still speaks


def test_a_one_sample_spike_is_not_named_and_close_spikes_are_one_period():
    assert verdict(_record(), _record(others={7: 2.5})) is None  # one second of a neighbour
    said = verdict(_record(), _record(others={4: 1.5, 5: 1.5, 8: 1.5})) or ""
    assert "others used 1.5 cores during steps 401-900 of the base run" in said, said


def test_samples_after_the_last_step_are_no_part_of_the_measured_window():
    # the final checkpoint's write after step 2003: two samples in which no step ran and the
    # job used few cores (as kiln-train's debug=fast job does)
    ended = _record(measured_from=3)
    samples = ended["telemetry"]["machine_series"]["samples"]
    for t in (20.0, 21.0):
        for key, value in (("t_s", t), ("seconds", 1.0), ("step_start", 2003), ("step_end", 2003)):
            samples[key].append(value)
        samples["other_cpu_cores"].append(0.0)
        samples["own_cpu_cores"].append(0.3)
    assert run_reasons(ended["telemetry"], "this run") == []
