"""The step reads in one place: one steady-state logged step of a tiny model through
``kiln.core.fit`` with the defaults runs at most 5 of kiln.core's files and 350 lines of
their functions on its own path (``scripts/trace_step.py``); timing, padding, the compile
watch, the machine sampler, the progress bar and the stop poll run at callback points."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import trace_step  # pyright: ignore[reportMissingImports]


def test_one_logged_step_runs_few_files_and_lines_and_observes_through_callbacks() -> None:
    figures = trace_step.trace()
    path, callbacks = figures["step_path"], figures["callbacks"]
    assert "loop/step.py:train_step" in " ".join(path["by_function"])  # the tracer saw it
    assert len(path["files"]) <= 5, path["files"]
    assert path["lines"] <= 350, path["by_function"]
    observed = " ".join(callbacks["by_function"])
    for point in ("StepTiming.on_step_end", "ProgressBar.on_log", "StopPoll.on_step_end"):
        assert point in observed, observed
    watching = [f for f in path["files"] if f.startswith("telemetry/") or f == "loop/observers.py"]
    assert not watching, path["files"]
