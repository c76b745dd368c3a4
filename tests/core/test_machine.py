"""kiln.core.telemetry.machine: the fingerprint, the load and the calibration a job records."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from kiln.core.telemetry.machine import (
    FINGERPRINT_KEYS,
    calibrate,
    calibrate_under_load,
    calibration_dtype,
    describe_machine,
    expand_hostlist,
    load_during,
)

SPINNER = """
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
end = time.monotonic() + 20
while time.monotonic() < end:
    pass
"""


def test_describe_machine_holds_the_fingerprint_and_versions():
    machine = describe_machine()
    assert set(FINGERPRINT_KEYS) <= set(machine)
    assert machine["affinity_cores"] == len(os.sched_getaffinity(0))
    assert machine["torch"] == torch.__version__
    assert machine["gpu_count"] == len(machine["gpu_names"])  # 0 here: no NVML driver needed


def test_an_idle_windows_load_subtracts_this_process_tree():
    _, sample = load_during(lambda: time.sleep(0.1))
    assert 0.1 <= sample["window_s"] < 0.5 and sample["loadavg_1m"] >= 0
    # other processes cannot use more cores than the machine has
    assert 0 <= sample["other_cpu_cores"] <= (os.cpu_count() or 1) + 0.5


def _spin(seconds: float) -> str:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return "done"


def test_load_during_counts_another_processs_cpu_and_not_this_ones(tmp_path):
    """A process outside this tree (its parent shell exited: it was re-parented) spinning on
    one core while this process spins on another shows as about one core of other load."""
    script, pid_file = tmp_path / "spin.py", tmp_path / "spin.pid"
    script.write_text(SPINNER)
    subprocess.run(["sh", "-c", f'"{sys.executable}" {script} {pid_file} >/dev/null 2>&1 &'])
    deadline = time.monotonic() + 10
    while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    try:
        time.sleep(0.2)  # the spinner is past its start-up
        result, load = load_during(lambda: _spin(0.6))
    finally:
        os.kill(pid, signal.SIGKILL)
    assert result == "done" and 0.6 <= load["window_s"] < 2
    assert load["other_cpu_cores"] >= 0.5, load  # the spinner; this process's own spin is not


def test_a_calibration_carries_the_load_of_its_own_window():
    cal, load = calibrate_under_load("cpu", "32-true")
    assert cal["matmul_gflop_per_s"] > 0 and load["loadavg_1m"] >= 0
    assert abs(load["window_s"] - cal["seconds"]) < 0.05  # one window: the calibration's
    assert 0 <= load["other_cpu_cores"] <= (os.cpu_count() or 1) + 0.5


@pytest.mark.parametrize(
    ("precision", "dtype"), [("32-true", "float32"), ("bf16-mixed", "bfloat16")]
)
def test_calibration_runs_at_the_precision_for_its_budget(precision, dtype):
    cal = calibrate("cpu", precision, budget_s=0.05)
    assert cal["matmul_dtype"] == dtype and cal["device"] == "cpu"
    assert cal["matmul_gflop_per_s"] > 0 and cal["copy_gb_per_s"] > 0
    assert cal["seconds"] >= 2 * 0.05  # both loops ran their budget (a load cannot fail this)


def test_an_unknown_precision_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"precision='fp8' is not valid; choose one of: 64-true"):
        calibration_dtype("fp8")


@pytest.mark.parametrize(
    ("hostlist", "names"),
    [
        ("node[0-1]", ["node0", "node1"]),
        ("vm", ["vm"]),
        ("node[0-1],gpu[08-10,12]", ["node0", "node1", "gpu08", "gpu09", "gpu10", "gpu12"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ],
)
def test_a_slurm_hostlist_expands_to_every_node_as_scontrol_does(hostlist, names):
    assert expand_hostlist(hostlist) == names
    if shutil.which("scontrol"):  # SLURM's own expansion, where SLURM is installed
        printed = subprocess.run(
            ["scontrol", "show", "hostnames", hostlist], capture_output=True, text=True, check=True
        )
        assert printed.stdout.split() == names


@pytest.mark.parametrize("hostlist", ["node[0-1", "node[a-b]", "node[1-]"])
def test_a_bad_slurm_hostlist_is_named(hostlist):
    with pytest.raises(ValueError, match="SLURM hostlist"):
        expand_hostlist(hostlist)


def test_the_machine_block_names_every_node_of_a_slurm_job(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[0-1]")
    machine = describe_machine()
    assert machine["slurm_nodelist"] == "node[0-1]"
    assert machine["slurm_nodes"] == ["node0", "node1"]
