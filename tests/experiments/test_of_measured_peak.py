"""A run's achieved FLOP/s over its machine's own measured matmul peak."""

from kiln.experiments.jobs.mfu import mfu_fields
from kiln.experiments.jobs.train_record import TrainRecord


def _record(accelerator: str, devices: int) -> TrainRecord:
    return TrainRecord.from_json(
        {
            "config": {"trainer": {"accelerator": accelerator, "devices": devices}},
            "devices": devices,
            "telemetry": {"flops_per_step": 1e9, "achieved_flops_per_s": 2e9, "mfu": None},
            "machine": {"matmul_peak": {"matmul_peak_gflop_per_s": 20.0}},
        }
    )


def test_a_cpu_run_reads_as_a_share_of_the_machines_own_peak():
    # the CPU peak is all the usable cores': any number of ranks divides by it once
    assert mfu_fields(_record("cpu", 1))["of_measured_peak"] == 0.1
    assert mfu_fields(_record("cpu", 2))["of_measured_peak"] == 0.1


def test_a_gpu_runs_peak_is_one_device_times_the_devices():
    assert mfu_fields(_record("cuda", 2))["of_measured_peak"] == 0.05


def test_without_a_measured_peak_there_is_no_share():
    record = TrainRecord.from_json({"telemetry": {"achieved_flops_per_s": 2e9}})
    assert mfu_fields(record)["of_measured_peak"] is None


def _stepped(flops: float, accelerator: str = "cpu", devices: int = 1) -> TrainRecord:
    """A step moving 2 x 100 MB of state (params 40 + grads 40 + optimizer 20 MB) per device
    in 0.1 s, on a machine of 100 GFLOP/s and 10 GB/s measured (ridge: 10 FLOP per byte)."""
    return TrainRecord.from_json(
        {
            "config": {"trainer": {"accelerator": accelerator, "devices": devices}},
            "devices": devices,
            "telemetry": {
                "flops_per_step": flops,
                "step_time_median_s": 0.1,
                "param_bytes": 40e6,
                "grad_bytes": 40e6,
                "optimizer_state_bytes": 20e6,
            },
            "machine": {
                "matmul_peak": {"matmul_peak_gflop_per_s": 100.0},
                "copy_peak": {"copy_peak_gb_per_s": 10.0},
            },
        }
    )


def test_a_bandwidth_bound_step_reads_as_a_share_of_the_machines_own_bandwidth():
    # 1 GFLOP over 200 MB moved: 5 FLOP/byte, under the ridge's 10: 2 GB/s of 10
    assert mfu_fields(_stepped(1e9))["of_measured_bandwidth"] == 0.2
    # on two GPUs: twice the bytes, over twice the bandwidth
    assert mfu_fields(_stepped(2e9, "cuda", 2))["of_measured_bandwidth"] == 0.2


def test_a_compute_bound_step_has_no_bandwidth_share():
    # 4 GFLOP over 200 MB: 20 FLOP/byte, above the ridge: the matmul peak is its limit
    assert mfu_fields(_stepped(4e9))["of_measured_bandwidth"] is None


def test_without_a_measured_bandwidth_there_is_no_share():
    record = _stepped(1e9)
    record.machine.pop("copy_peak")
    assert mfu_fields(record)["of_measured_bandwidth"] is None
