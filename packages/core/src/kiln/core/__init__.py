"""kiln.core: a plain Lightning Fabric loop that gets accumulation, precision, compile and
checkpoints exactly right. It knows nothing of HF, TIMM, Hydra or W&B.

Names are imported on first use: ``from kiln.core import TrainerConfig`` does not import
Fabric; ``from kiln.core import fit`` does.
"""

from typing import TYPE_CHECKING

from kiln.core.__about__ import __version__ as __version__  # the packages' one version
from kiln.core.lazy import lazy_package

_EXPORTS = {
    "atomic_write": "kiln.core.atomic",
    "load_checkpoint": "kiln.core.checkpoints.load",
    "load_weights": "kiln.core.checkpoints.load",
    "read_checkpoint_meta": "kiln.core.checkpoints.load",
    "check_not_a_plain_directory": "kiln.core.checkpoints.lookup",
    "checkpoint_candidates": "kiln.core.checkpoints.lookup",
    "checkpoint_path": "kiln.core.checkpoints.lookup",
    "damage": "kiln.core.checkpoints.lookup",
    "find_latest_checkpoint": "kiln.core.checkpoints.lookup",
    "is_legacy": "kiln.core.checkpoints.lookup",
    "CheckpointDirError": "kiln.core.checkpoints.rundir",
    "CheckpointWriteError": "kiln.core.checkpoints.rundir",
    "DamagedCheckpointError": "kiln.core.checkpoints.rundir",
    "check_writable": "kiln.core.checkpoints.rundir",
    "plan_claim": "kiln.core.checkpoints.rundir",
    "read_run_file": "kiln.core.checkpoints.rundir",
    "CheckpointWrites": "kiln.core.checkpoints.save",
    "save_checkpoint": "kiln.core.checkpoints.save",
    "COMPILE_MODES": "kiln.core.config",
    "CATEGORY_ORDER": "kiln.core.telemetry.profile",
    "StepBreakdown": "kiln.core.telemetry.profile",
    "step_breakdown": "kiln.core.telemetry.profile",
    "profiler_activities": "kiln.core.telemetry.profile",
    "write_profile": "kiln.core.telemetry.profile",
    "CompileConfig": "kiln.core.config",
    "ProfileConfig": "kiln.core.config",
    "PRECISIONS": "kiln.core.config",
    "TrainerConfig": "kiln.core.config",
    "check_global_batch": "kiln.core.config",
    "launch": "kiln.core.distributed.launch",
    "launched_externally": "kiln.core.distributed.launch",
    "hand_over": "kiln.core.distributed.stop",
    "ignore_repeated_signals": "kiln.core.distributed.stop",
    "requested_signal": "kiln.core.distributed.stop",
    "stop_on_signals": "kiln.core.distributed.stop",
    "apply_threads_per_rank": "kiln.core.distributed.threads",
    "threads_per_rank": "kiln.core.distributed.threads",
    "EmptyWindowError": "kiln.core.errors",
    "NonFiniteGradientError": "kiln.core.errors",
    "NonFiniteLossError": "kiln.core.errors",
    "NonFiniteWeightsError": "kiln.core.errors",
    "lazy_package": "kiln.core.lazy",
    "structured_trace": "kiln.core.upstream_internals",
    "fit": "kiln.core.loop.fit",
    "unpack_optimizers": "kiln.core.loop.optim",
    "PrecisionAudit": "kiln.core.loop.precision_audit",
    "precision_audit": "kiln.core.loop.precision_audit",
    "rank_seed": "kiln.core.loop.seeding",
    "weights_hash": "kiln.core.loop.seeding",
    "require": "kiln.core.optional",
    "FitResult": "kiln.core.state",
    "CompileWatch": "kiln.core.telemetry.compile_watch",
    "FINGERPRINT_KEYS": "kiln.core.telemetry.machine",
    "calibrate_under_load": "kiln.core.telemetry.machine",
    "describe_machine": "kiln.core.telemetry.machine",
    "expand_hostlist": "kiln.core.telemetry.machine",
    "measured_peak": "kiln.core.telemetry.machine",
    "measured_bandwidth": "kiln.core.telemetry.machine",
    "usable_cores": "kiln.core.telemetry.machine",
    "reset_cpu_peak": "kiln.core.telemetry.memory",
    "status_kb": "kiln.core.telemetry.memory",
    "tensor_bytes": "kiln.core.telemetry.memory",
    "CacheFigures": "kiln.core.telemetry.records",
    "Calibration": "kiln.core.telemetry.records",
    "CompileCounts": "kiln.core.telemetry.records",
    "GpuInfo": "kiln.core.telemetry.records",
    "GpuLoad": "kiln.core.telemetry.records",
    "LoadSample": "kiln.core.telemetry.records",
    "Machine": "kiln.core.telemetry.records",
    "MatmulPeak": "kiln.core.telemetry.records",
    "CopyPeak": "kiln.core.telemetry.records",
    "Telemetry": "kiln.core.telemetry.records",
}
__all__ = [
    "CATEGORY_ORDER",
    "COMPILE_MODES",
    "FINGERPRINT_KEYS",
    "PRECISIONS",
    "CacheFigures",
    "Calibration",
    "CheckpointDirError",
    "CheckpointWriteError",
    "CheckpointWrites",
    "CompileConfig",
    "CompileCounts",
    "CompileWatch",
    "CopyPeak",
    "DamagedCheckpointError",
    "EmptyWindowError",
    "FitResult",
    "GpuInfo",
    "GpuLoad",
    "LoadSample",
    "Machine",
    "MatmulPeak",
    "NonFiniteGradientError",
    "NonFiniteLossError",
    "NonFiniteWeightsError",
    "PrecisionAudit",
    "ProfileConfig",
    "StepBreakdown",
    "Telemetry",
    "TrainerConfig",
    "apply_threads_per_rank",
    "atomic_write",
    "calibrate_under_load",
    "check_global_batch",
    "check_not_a_plain_directory",
    "check_writable",
    "checkpoint_candidates",
    "checkpoint_path",
    "damage",
    "describe_machine",
    "expand_hostlist",
    "find_latest_checkpoint",
    "fit",
    "hand_over",
    "ignore_repeated_signals",
    "is_legacy",
    "launch",
    "launched_externally",
    "lazy_package",
    "load_checkpoint",
    "load_weights",
    "measured_bandwidth",
    "measured_peak",
    "plan_claim",
    "precision_audit",
    "profiler_activities",
    "rank_seed",
    "read_checkpoint_meta",
    "read_run_file",
    "requested_signal",
    "require",
    "reset_cpu_peak",
    "save_checkpoint",
    "status_kb",
    "step_breakdown",
    "stop_on_signals",
    "structured_trace",
    "tensor_bytes",
    "threads_per_rank",
    "unpack_optimizers",
    "usable_cores",
    "weights_hash",
    "write_profile",
]
lazy_package(__name__, _EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see
    from kiln.core.atomic import atomic_write
    from kiln.core.checkpoints.load import load_checkpoint, load_weights, read_checkpoint_meta
    from kiln.core.checkpoints.lookup import (
        check_not_a_plain_directory,
        checkpoint_candidates,
        checkpoint_path,
        damage,
        find_latest_checkpoint,
        is_legacy,
    )
    from kiln.core.checkpoints.rundir import (
        CheckpointDirError,
        CheckpointWriteError,
        DamagedCheckpointError,
        check_writable,
        plan_claim,
        read_run_file,
    )
    from kiln.core.checkpoints.save import CheckpointWrites, save_checkpoint
    from kiln.core.config import (
        COMPILE_MODES,
        PRECISIONS,
        CompileConfig,
        ProfileConfig,
        TrainerConfig,
        check_global_batch,
    )
    from kiln.core.distributed.launch import launch, launched_externally
    from kiln.core.distributed.stop import (
        hand_over,
        ignore_repeated_signals,
        requested_signal,
        stop_on_signals,
    )
    from kiln.core.distributed.threads import apply_threads_per_rank, threads_per_rank
    from kiln.core.errors import (
        EmptyWindowError,
        NonFiniteGradientError,
        NonFiniteLossError,
        NonFiniteWeightsError,
    )
    from kiln.core.loop.fit import fit
    from kiln.core.loop.optim import unpack_optimizers
    from kiln.core.loop.precision_audit import PrecisionAudit, precision_audit
    from kiln.core.loop.seeding import rank_seed, weights_hash
    from kiln.core.optional import require
    from kiln.core.state import FitResult
    from kiln.core.telemetry.compile_watch import CompileWatch
    from kiln.core.telemetry.machine import (
        FINGERPRINT_KEYS,
        calibrate_under_load,
        describe_machine,
        expand_hostlist,
        measured_bandwidth,
        measured_peak,
        usable_cores,
    )
    from kiln.core.telemetry.memory import reset_cpu_peak, status_kb, tensor_bytes
    from kiln.core.telemetry.profile import (
        CATEGORY_ORDER,
        StepBreakdown,
        profiler_activities,
        step_breakdown,
        write_profile,
    )
    from kiln.core.telemetry.records import (
        CacheFigures,
        Calibration,
        CompileCounts,
        CopyPeak,
        GpuInfo,
        GpuLoad,
        LoadSample,
        Machine,
        MatmulPeak,
        Telemetry,
    )
    from kiln.core.upstream_internals import structured_trace
