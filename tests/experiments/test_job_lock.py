"""The job directory's lock belongs to the job's process alone: a forked child of it (a
DataLoader worker) does not keep it once the job is gone."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from kiln.experiments.jobs.lock import job_dir_lock


def test_a_forked_child_does_not_hold_the_lock(tmp_path: Path) -> None:
    started, ready = os.pipe()
    with job_dir_lock(tmp_path):
        child = os.fork()
        if child == 0:  # a worker that outlives its job for a while, as orphans do
            os.write(ready, b"1")  # running: the fork's hooks are done
            time.sleep(30)
            os._exit(0)
        os.read(started, 1)
    try:
        with job_dir_lock(tmp_path):  # the job has ended; its resume takes the lock at once
            pass
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
