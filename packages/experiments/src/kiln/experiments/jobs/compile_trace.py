"""``compile.trace=true``: a job's torch.compile trace and its tlparse report, in the job dir.

While the job runs, torch's structured trace (``kiln.core.upstream_internals``) goes to
``<job dir>/compile_trace/``; afterwards ``tlparse`` (the ``trace`` extra, PyPI's ``tlparse``)
turns each process's log into an HTML report in ``<job dir>/tlparse/`` (``index.html``:
every compiled frame, its graphs, graph breaks, recompiles and guards). The job's record
names both under ``compile_trace``, and the report goes to W&B as an artifact.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TRACE_DIR = "compile_trace"
REPORT_DIR = "tlparse"
TLPARSE_TIMEOUT_S = 300


def tlparse_command() -> str | None:
    """The ``tlparse`` executable: beside this Python's, else on ``PATH``; ``None`` without."""
    beside = Path(sys.executable).parent / "tlparse"
    return str(beside) if beside.is_file() else shutil.which("tlparse")


def tlparse_report(trace_dir: Path, out_dir: Path) -> dict[str, Any]:
    """Run tlparse on each trace log in ``trace_dir``, one report folder per log in ``out_dir``.

    Returns:
        ``{"trace_dir", "logs", "reports" (each report's index.html), "error"}``; ``error`` says
        why a report is missing (no tlparse, no log written, tlparse failing) or is ``None``.
    """
    logs = sorted(trace_dir.glob("*.log"))
    info: dict[str, Any] = {
        "trace_dir": str(trace_dir),
        "logs": [str(p) for p in logs],
        "reports": [],
        "error": None,
    }
    command = tlparse_command()
    if not logs:
        info["error"] = "no trace written (nothing was compiled)"
    elif command is None:
        info["error"] = "tlparse is not installed (pip install tlparse, or kiln-experiments[trace])"
    for log in logs if command else []:
        target = out_dir if len(logs) == 1 else out_dir / log.stem
        proc = subprocess.run(
            [command, str(log), "-o", str(target), "--overwrite", "--no-browser"],
            capture_output=True,
            text=True,
            timeout=TLPARSE_TIMEOUT_S,
        )
        if proc.returncode != 0 or not (target / "index.html").is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            info["error"] = f"tlparse {log.name}: exit {proc.returncode}: {tail[0]}"
        else:
            info["reports"].append(str(target / "index.html"))
    return info


@contextmanager
def compile_trace(enabled: bool, job_dir: str | Path) -> Iterator[dict[str, Any]]:
    """Trace the block's compiles into ``job_dir`` when ``enabled``; the yielded dict is
    filled with :func:`tlparse_report`'s figures when the block ends (empty when disabled)."""
    info: dict[str, Any] = {}
    if not enabled:
        yield info
        return
    from kiln.core.upstream_internals import structured_trace

    trace_dir = Path(job_dir) / TRACE_DIR
    try:
        with structured_trace(trace_dir):
            yield info
    finally:
        info.update(tlparse_report(trace_dir, Path(job_dir) / REPORT_DIR))


def log_trace(tracker: Any, job_dir: str | Path) -> str | None:
    """Log the job's tlparse report folder to its W&B run (``tracker``: a ``Tracker`` or
    ``None``) as an artifact ``tlparse-<run id>`` of type ``compile-trace``; returns its name,
    or ``None`` when there is no run or no report."""
    report = Path(job_dir) / REPORT_DIR
    if tracker is None or tracker.run is None or not report.is_dir():
        return None
    name = f"tlparse-{tracker.run.id}"
    tracker.log_folder(report, name, "compile-trace")
    return name
