"""A kiln plugin (``plugins=[end_signal_hook]``, this folder on ``PYTHONPATH``:
:data:`HOOK`) that holds a SLURM job at one instant until a signal reaches it there, so that a
test can send one through SLURM (``scancel``, a preemption), whose trip through slurmctld and
slurmd takes longer than a tiny job's start or end. Rank 0 only; without its variables it does
nothing (a re-run of the same sweep loads it too).

- ``KILN_TEST_HOLD_START=<file>``: while the plugin loads (the job's config stage: its attempt
  is in ``attempts.json``, training has not started), the first attempt that gets here touches
  ``<file>`` and sleeps up to 300 s, until a signal's handler ends the sleep (submitit's
  requeue on USR2 exits the process).
- ``KILN_TEST_HOLD_END=<file>``: once the final ``summary.json`` of the first attempt that
  ends ``ok`` is written, before its W&B run's end, the job touches ``<file>`` and waits (up to
  300 s) until it holds a SIGTERM or SIGINT (``Lifecycle.held``), then ends as it does.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from kiln.experiments.jobs.lifecycle import Lifecycle

HOOK = ("plugins=[end_signal_hook]", str(Path(__file__).resolve().parent))
"""The override that loads the plugin, and the folder to put on ``PYTHONPATH``."""
HOLD_S = 300

_finish_tracker = Lifecycle._finish_tracker


def _rank_zero_of_a_job() -> bool:
    """Rank 0 of the SLURM job, not the sweep's own process (which loads the plugin too when
    it checks every job's config before submitting)."""
    return "SLURM_JOB_ID" in os.environ and os.environ.get("SLURM_PROCID", "0") == "0"


def _held_end(self: Lifecycle) -> None:
    marker = os.environ.get("KILN_TEST_HOLD_END")
    if marker and self.writer and self.record["status"] == "ok" and not Path(marker).exists():
        Path(marker).touch()
        deadline = time.monotonic() + HOLD_S
        while not self.held and time.monotonic() < deadline:
            time.sleep(0.05)
    _finish_tracker(self)


if os.environ.get("KILN_TEST_HOLD_END"):
    Lifecycle._finish_tracker = _held_end  # type: ignore[method-assign]

_start = os.environ.get("KILN_TEST_HOLD_START")
if _start and _rank_zero_of_a_job() and not Path(_start).exists():
    Path(_start).touch()
    time.sleep(HOLD_S)
