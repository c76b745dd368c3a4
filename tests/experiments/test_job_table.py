"""The table kiln-train prints at the end of a job: FLOPs per step, TFLOP/s, MFU, compile cache."""

import json

from rich.console import Console

from kiln.experiments.jobs.console import job_table


def render(summary):
    console = Console(width=160, record=True, file=open("/dev/null", "w"))
    console.print(job_table(summary))
    return console.export_text()


def job_summary(tmp_path, mfu, device_count, **telemetry):
    """A summary.json as kiln-train writes it, read back, with kiln.core's FLOPs telemetry."""
    record = {
        "status": "ok",
        "global_step": 40,
        "train_loss": 0.5,
        "metrics": {"val/accuracy": 0.75},
        "telemetry": {
            "step_time_median_s": 0.02,
            "flops_per_step": 6.0e11,
            "achieved_flops_per_s": 6.0e11 / 0.02,
            "mfu": mfu,
            **telemetry,
        },
        "machine": {"device": "x", "device_count": device_count},
        "config": {"trainer": {"accelerator": "cuda" if device_count else "cpu"}},
        "run_name": "r",
        "output_dir": str(tmp_path),
    }
    (tmp_path / "summary.json").write_text(json.dumps(record))
    return json.loads((tmp_path / "summary.json").read_text())


def test_job_table_shows_mfu_on_a_gpu(tmp_path):
    text = render(job_summary(tmp_path, 0.412, 1, compile_cache="warm"))
    assert "FLOPs/step" in text and "6e+11" in text
    assert "achieved TFLOP/s" in text and f"{6.0e11 / 0.02 / 1e12:.4g}" in text
    assert f"{0.412:.1%}" in text
    assert "compile cache" in text and "warm" in text
    assert "telemetry/mfu" not in text  # one row per figure


def test_job_table_says_mfu_is_not_available_on_the_cpu(tmp_path):
    text = render(job_summary(tmp_path, None, 0))
    assert "n/a (cpu)" in text
    assert "compile cache" not in text  # eager: nothing looked up


def test_job_table_without_flops_telemetry_says_so(tmp_path):
    summary = job_summary(tmp_path, None, 0)
    for key in ("flops_per_step", "achieved_flops_per_s", "mfu"):
        del summary["telemetry"][key]
    assert "n/a (flops not counted)" in render(summary)


def test_an_error_with_brackets_is_printed_as_it_is(tmp_path):
    """gloo's errors start with ``[/path/pair.cc:561]``, which rich read as a closing tag and
    raised MarkupError at the end of a failed multi-node job."""
    error = "RuntimeError: [/__w/gloo/pair.cc:561] Connection closed by peer [10.77.0.11]:1"
    summary = {**job_summary(tmp_path, None, 0), "status": "failed", "error": error}
    assert error in render(summary).replace("\n", "")
