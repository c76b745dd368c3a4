"""What a run costs and where it ran: step times (``step_timer.py``), compilation
(``compile_watch.py``), FLOPs and MFU (``flops.py``), memory (``memory.py``), the machine and
its load (``machine.py``), and the progress shown while it trains (``progress.py``).

Its public names (``__all__``) are what the other kiln packages use; they are imported on
first use, so importing this package imports nothing else.
"""

from typing import TYPE_CHECKING

from kiln.core.lazy import lazy_package

_EXPORTS = {
    "GpuInfo": "kiln.core.telemetry.records",
    "Telemetry": "kiln.core.telemetry.records",
    "Machine": "kiln.core.telemetry.records",
    "LoadSample": "kiln.core.telemetry.records",
    "GpuLoad": "kiln.core.telemetry.records",
    "Calibration": "kiln.core.telemetry.records",
    "CompileWatch": "kiln.core.telemetry.compile_watch",
    "FINGERPRINT_KEYS": "kiln.core.telemetry.machine",
    "calibrate_under_load": "kiln.core.telemetry.machine",
    "describe_machine": "kiln.core.telemetry.machine",
    "expand_hostlist": "kiln.core.telemetry.machine",
    "reset_cpu_peak": "kiln.core.telemetry.memory",
    "status_kb": "kiln.core.telemetry.memory",
    "tensor_bytes": "kiln.core.telemetry.memory",
    "usable_cores": "kiln.core.telemetry.machine",
}
__all__ = [
    "FINGERPRINT_KEYS",
    "Calibration",
    "CompileWatch",
    "GpuInfo",
    "GpuLoad",
    "LoadSample",
    "Machine",
    "Telemetry",
    "calibrate_under_load",
    "describe_machine",
    "expand_hostlist",
    "reset_cpu_peak",
    "status_kb",
    "tensor_bytes",
    "usable_cores",
]
lazy_package(__name__, _EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see
    from kiln.core.telemetry.compile_watch import CompileWatch
    from kiln.core.telemetry.machine import (
        FINGERPRINT_KEYS,
        calibrate_under_load,
        describe_machine,
        expand_hostlist,
        usable_cores,
    )
    from kiln.core.telemetry.memory import reset_cpu_peak, status_kb, tensor_bytes
    from kiln.core.telemetry.records import (
        Calibration,
        GpuInfo,
        GpuLoad,
        LoadSample,
        Machine,
        Telemetry,
    )
