"""kiln.core: a plain Lightning Fabric loop that gets accumulation, precision, compile and
checkpoints exactly right. It knows nothing of HF, TIMM, Hydra or W&B.

These names are what a user of ``fit`` needs: ``fit``, its configs and result, the errors it
raises, the callback points (``Callback``, ``FitHandle``), the checkpoint state registry and
loading. Everything else is imported from the module that defines it (for example
``kiln.core.telemetry.machine.describe_machine``, ``kiln.core.checkpoints.lookup``).

Names are imported on first use: ``from kiln.core import TrainerConfig`` does not import
Fabric; ``from kiln.core import fit`` does.
"""

from typing import TYPE_CHECKING

from kiln.core.__about__ import __version__ as __version__  # the packages' one version
from kiln.core.lazy import lazy_package

_EXPORTS = {
    "fit": "kiln.core.loop.fit",
    "TrainerConfig": "kiln.core.config",
    "CompileConfig": "kiln.core.config",
    "ProfileConfig": "kiln.core.config",
    "PRECISIONS": "kiln.core.config",
    "COMPILE_MODES": "kiln.core.config",
    "FitResult": "kiln.core.state",
    "Callback": "kiln.core.callback_points",
    "FitHandle": "kiln.core.callbacks.handle",
    "CheckpointState": "kiln.core.checkpoints.registry",
    "Stateful": "kiln.core.checkpoints.registry",
    "EmptyWindowError": "kiln.core.errors",
    "NonFiniteLossError": "kiln.core.errors",
    "NonFiniteGradientError": "kiln.core.errors",
    "NonFiniteWeightsError": "kiln.core.errors",
    "CheckpointDirError": "kiln.core.checkpoints.rundir",
    "CheckpointWriteError": "kiln.core.checkpoints.rundir",
    "DamagedCheckpointError": "kiln.core.checkpoints.rundir",
    "StateChangedError": "kiln.core.checkpoints.registry",
    "launch": "kiln.core.distributed.launch",
    "load_weights": "kiln.core.checkpoints.load",
    "read_checkpoint_meta": "kiln.core.checkpoints.load",
    "unpack_optimizers": "kiln.core.loop.optim",
    "rank_seed": "kiln.core.loop.seeding",
    "weights_hash": "kiln.core.loop.seeding",
}
__all__ = [
    "COMPILE_MODES",
    "PRECISIONS",
    "Callback",
    "CheckpointDirError",
    "CheckpointState",
    "CheckpointWriteError",
    "CompileConfig",
    "DamagedCheckpointError",
    "EmptyWindowError",
    "FitHandle",
    "FitResult",
    "NonFiniteGradientError",
    "NonFiniteLossError",
    "NonFiniteWeightsError",
    "ProfileConfig",
    "StateChangedError",
    "Stateful",
    "TrainerConfig",
    "fit",
    "launch",
    "load_weights",
    "rank_seed",
    "read_checkpoint_meta",
    "unpack_optimizers",
    "weights_hash",
]
lazy_package(__name__, _EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see
    from kiln.core.callback_points import Callback
    from kiln.core.callbacks.handle import FitHandle
    from kiln.core.checkpoints.load import load_weights, read_checkpoint_meta
    from kiln.core.checkpoints.registry import CheckpointState, StateChangedError, Stateful
    from kiln.core.checkpoints.rundir import (
        CheckpointDirError,
        CheckpointWriteError,
        DamagedCheckpointError,
    )
    from kiln.core.config import (
        COMPILE_MODES,
        PRECISIONS,
        CompileConfig,
        ProfileConfig,
        TrainerConfig,
    )
    from kiln.core.distributed.launch import launch
    from kiln.core.errors import (
        EmptyWindowError,
        NonFiniteGradientError,
        NonFiniteLossError,
        NonFiniteWeightsError,
    )
    from kiln.core.loop.fit import fit
    from kiln.core.loop.optim import unpack_optimizers
    from kiln.core.loop.seeding import rank_seed, weights_hash
    from kiln.core.state import FitResult
