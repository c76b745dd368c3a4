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
