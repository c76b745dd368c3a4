"""Beyond one process: starting worker processes (``launch.py``), stopping every rank alike
on a signal (``stop.py``), each rank's threads (``threads.py``) and FSDP2 sharding
(``sharding.py``).

Its public names (``__all__``) are what the other kiln packages use; they are imported on
first use, so importing this package imports nothing else.
"""

from typing import TYPE_CHECKING

from kiln.core.lazy import lazy_package

_EXPORTS = {
    "apply_threads_per_rank": "kiln.core.distributed.threads",
    "hand_over": "kiln.core.distributed.stop",
    "ignore_repeated_signals": "kiln.core.distributed.stop",
    "launched_externally": "kiln.core.distributed.launch",
    "requested_signal": "kiln.core.distributed.stop",
    "stop_on_signals": "kiln.core.distributed.stop",
    "threads_per_rank": "kiln.core.distributed.threads",
}
__all__ = [
    "apply_threads_per_rank",
    "hand_over",
    "ignore_repeated_signals",
    "launched_externally",
    "requested_signal",
    "stop_on_signals",
    "threads_per_rank",
]
lazy_package(__name__, _EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see
    from kiln.core.distributed.launch import launched_externally
    from kiln.core.distributed.stop import (
        hand_over,
        ignore_repeated_signals,
        requested_signal,
        stop_on_signals,
    )
    from kiln.core.distributed.threads import apply_threads_per_rank, threads_per_rank
