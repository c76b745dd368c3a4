"""``kiln-train`` that is ended right after its job's final ``summary.json`` write, before its
W&B run's end: what a kill or a signal at that instant leaves.

``KILN_END=sigkill`` (the default): SIGKILL (OOM killer, a node lost, ``scancel`` past its
grace), ``KILN_KILL_PAUSE_S`` seconds after the write (default at once). ``KILN_END=sigterm``:
SIGTERM to W&B's service and to the job, as SLURM's ``scancel`` or preemption signals every
process of the job; the job then ends as it does.

Run as a script: ``python kill_after_record.py <kiln-train args>``.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil

from kiln.experiments.jobs.lifecycle import Lifecycle

_finish_tracker = Lifecycle._finish_tracker


def _ended(self: Lifecycle) -> None:
    """In place of ``Lifecycle._finish_tracker``: called once the record is written."""
    if os.environ.get("KILN_END", "sigkill") == "sigkill":
        time.sleep(float(os.environ.get("KILN_KILL_PAUSE_S", "0")))
        os.kill(os.getpid(), signal.SIGKILL)
    children = psutil.Process().children(recursive=True)
    services = [p for p in children if "wandb" in " ".join(p.cmdline())]
    assert services, [p.cmdline() for p in children]
    for service in services:
        service.terminate()
    psutil.wait_procs(services, timeout=30)
    os.kill(os.getpid(), signal.SIGTERM)
    _finish_tracker(self)


if __name__ == "__main__":
    Lifecycle._finish_tracker = _ended  # type: ignore[method-assign]
    from kiln.experiments.train.cli import main

    sys.argv[0] = "kiln-train"
    main()
