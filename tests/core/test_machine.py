"""kiln.core.telemetry.machine: the fingerprint, the load and the calibration a job records."""

import os

import pytest
import torch

from kiln.core.telemetry.machine import (
    FINGERPRINT_KEYS,
    calibrate,
    calibration_dtype,
    describe_machine,
    expand_hostlist,
    load_sample,
)


def test_describe_machine_holds_the_fingerprint_and_versions():
    machine = describe_machine()
    assert set(FINGERPRINT_KEYS) <= set(machine)
    assert machine["affinity_cores"] == len(os.sched_getaffinity(0))
    assert machine["torch"] == torch.__version__
    assert machine["gpu_count"] == len(machine["gpu_names"])  # 0 here: no NVML driver needed


def test_load_sample_subtracts_this_process_tree():
    sample = load_sample(window_s=0.1)
    assert sample["window_s"] == 0.1 and sample["loadavg_1m"] >= 0
    # other processes cannot use more cores than the machine has
    assert 0 <= sample["other_cpu_cores"] <= (os.cpu_count() or 1) + 0.5


@pytest.mark.parametrize(
    ("precision", "dtype"), [("32-true", "float32"), ("bf16-mixed", "bfloat16")]
)
def test_calibration_runs_at_the_precision_in_well_under_a_second(precision, dtype):
    cal = calibrate("cpu", precision, budget_s=0.05)
    assert cal["matmul_dtype"] == dtype and cal["device"] == "cpu"
    assert cal["matmul_gflop_per_s"] > 0 and cal["copy_gb_per_s"] > 0
    assert cal["seconds"] < 1.0


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


@pytest.mark.parametrize("hostlist", ["node[0-1", "node[a-b]", "node[1-]"])
def test_a_bad_slurm_hostlist_is_named(hostlist):
    with pytest.raises(ValueError, match="SLURM hostlist"):
        expand_hostlist(hostlist)


def test_the_machine_block_names_every_node_of_a_slurm_job(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[0-1]")
    machine = describe_machine()
    assert machine["slurm_nodelist"] == "node[0-1]"
    assert machine["slurm_nodes"] == ["node0", "node1"]
