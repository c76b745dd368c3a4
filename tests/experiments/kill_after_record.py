"""``kiln-train`` that SIGKILLs itself right after its job's final ``summary.json`` write,
before its W&B run's end (``KILN_KILL_PAUSE_S`` seconds later, default at once): what a
kill at that instant (OOM killer, a node lost, ``scancel`` past its grace) leaves.

Run as a script: ``python kill_after_record.py <kiln-train args>``.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from kiln.experiments.jobs.lifecycle import Lifecycle


def _killed(self: Lifecycle) -> None:
    """In place of ``Lifecycle._finish_tracker``: called once the record is written."""
    time.sleep(float(os.environ.get("KILN_KILL_PAUSE_S", "0")))
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    Lifecycle._finish_tracker = _killed  # type: ignore[method-assign]
    from kiln.experiments.train.cli import main

    sys.argv[0] = "kiln-train"
    main()
