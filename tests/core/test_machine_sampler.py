"""kiln.core.telemetry.sampler: the machine sampled through a run, aligned with its steps."""

import os
import signal
import subprocess
import sys
import time

import pytest
from toy import ToyTokenModule
from trainers import trainer_config

from kiln.core import TrainerConfig, fit
from kiln.core.telemetry.sampler import MachineSampler

SPINNER = """
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    pass
"""


def _spinner(tmp_path, seconds: float) -> int:
    """A process outside this tree (its shell exited: it was re-parented) spinning on a core."""
    script, pid_file = tmp_path / "spin.py", tmp_path / "spin.pid"
    script.write_text(SPINNER)
    command = f'"{sys.executable}" {script} {pid_file} {seconds} >/dev/null 2>&1 &'
    subprocess.run(["sh", "-c", command], check=True)
    deadline = time.monotonic() + 10
    while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return int(pid_file.read_text())


@pytest.mark.process  # measures other processes' CPU: alone, not beside the xdist workers
def test_a_neighbour_in_the_middle_of_a_run_shows_in_the_steps_it_overlapped(tmp_path):
    """Steps 1-10, 11-20 with another process spinning, 21-30: the samples over steps 11-20
    hold a core more of other load than the rest (the machine is shared: the rest need not
    be idle), and the job's own (sleeping) steps take next to no CPU."""
    steps = 0
    sampler = MachineSampler(lambda: steps, interval_s=0.1)
    with sampler:
        for step in range(1, 31):
            if step == 11:
                pid = _spinner(tmp_path, 60)
                time.sleep(0.2)  # past its start-up
            if step == 21:
                os.kill(pid, signal.SIGKILL)
                time.sleep(0.2)
            time.sleep(0.05)
            steps = step
    samples = sampler.series(measured_from_step=0)["samples"]
    windows = list(
        zip(samples["other_cpu_cores"], samples["step_start"], samples["step_end"], strict=True)
    )
    busy = [o for o, a, b in windows if 12 <= a and b <= 19 and b > a]  # not at its edges
    quiet = [o for o, a, b in windows if b <= 10 or a >= 22]
    assert busy and quiet, samples
    busy_median, quiet_median = sorted(busy)[len(busy) // 2], sorted(quiet)[len(quiet) // 2]
    assert busy_median - quiet_median >= 0.5, samples
    own = sorted(samples["own_cpu_cores"])
    assert own[len(own) // 2] < 0.5, samples  # sleeping steps
    assert samples["step_start"][0] == 0 and samples["step_end"][-1] == 30
    # the windows tile the run: each starts where the previous one ended
    assert samples["step_start"][1:] == samples["step_end"][:-1]


def test_a_long_run_thins_its_series_by_merging_neighbours():
    steps = 0
    sampler = MachineSampler(lambda: steps, interval_s=10.0, limit=8).start()
    try:
        for step in range(1, 41):
            steps = step
            sampler.sample()
    finally:
        sampler.stop()
    series = sampler.series(measured_from_step=3)
    samples = series["samples"]
    assert 4 <= len(samples["t_s"]) < 8  # merged in pairs each time it filled
    assert series["interval_s"] > 10.0 and series["measured_from_step"] == 3
    assert samples["step_start"][0] == 0 and samples["step_end"][-1] == 40
    assert samples["step_start"][1:] == samples["step_end"][:-1]


def test_fit_keeps_the_series_in_its_telemetry_and_logs_it_as_history(tmp_path):
    from lightning.fabric.loggers import CSVLogger

    logger = CSVLogger(root_dir=tmp_path, name="csv", version="")
    result = fit(
        ToyTokenModule(),
        trainer_config(max_steps=40, warmup_steps=5, machine_sample_s=0.01),
        loggers=[logger],
    )
    series = result.telemetry["machine_series"]
    samples = series["samples"]
    assert series["measured_from_step"] == 5
    assert samples["step_end"][-1] == 40 and len(samples["t_s"]) >= 2
    assert all(c >= 0 for c in samples["own_cpu_cores"] + samples["other_cpu_cores"])
    # logged beside the loss, but not in the run's history, which a resume reproduces exactly
    assert "machine/own_cpu_cores" in (tmp_path / "csv" / "metrics.csv").read_text()
    assert not any(k.startswith("machine/") for row in result.history for k in row)


def test_fit_samples_nothing_when_told_not_to():
    result = fit(ToyTokenModule(), trainer_config(machine_sample_s=None))
    assert "machine_series" not in result.telemetry
    assert not any(k.startswith("machine/") for row in result.history for k in row)


@pytest.mark.parametrize("value", [0, -1.0, float("nan")])
def test_a_bad_sampling_interval_is_named(value):
    with pytest.raises(
        ValueError, match=r"trainer.machine_sample_s=.* use a finite positive number, or null"
    ):
        TrainerConfig(machine_sample_s=value)
