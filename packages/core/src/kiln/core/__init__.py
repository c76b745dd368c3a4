"""kiln.core: a plain Lightning Fabric loop that gets accumulation, precision, compile and
checkpoints exactly right. It knows nothing of HF, TIMM, Hydra or W&B.

Names are imported on first use: ``from kiln.core import TrainerConfig`` does not import
Fabric; ``from kiln.core import fit`` does.
"""

from typing import TYPE_CHECKING

from kiln.core.__about__ import __version__ as __version__  # the packages' one version
from kiln.core.lazy import lazy_package

_EXPORTS = {
    "COMPILE_MODES": "kiln.core.config",
    "PRECISIONS": "kiln.core.config",
    "CompileConfig": "kiln.core.config",
    "TrainerConfig": "kiln.core.config",
    "EmptyWindowError": "kiln.core.errors",
    "NonFiniteGradientError": "kiln.core.errors",
    "NonFiniteLossError": "kiln.core.errors",
    "NonFiniteWeightsError": "kiln.core.errors",
    "launch": "kiln.core.launch",
    "fit": "kiln.core.loop",
    "unpack_optimizers": "kiln.core.optim",
    "CheckpointDirError": "kiln.core.rundir",
    "DamagedCheckpointError": "kiln.core.rundir",
    "rank_seed": "kiln.core.seeding",
    "weights_hash": "kiln.core.seeding",
    "FitResult": "kiln.core.state",
}
__all__ = [
    "COMPILE_MODES",
    "PRECISIONS",
    "CheckpointDirError",
    "CompileConfig",
    "DamagedCheckpointError",
    "EmptyWindowError",
    "FitResult",
    "NonFiniteGradientError",
    "NonFiniteLossError",
    "NonFiniteWeightsError",
    "TrainerConfig",
    "fit",
    "launch",
    "rank_seed",
    "unpack_optimizers",
    "weights_hash",
]
lazy_package(__name__, _EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see
    from kiln.core.config import COMPILE_MODES, PRECISIONS, CompileConfig, TrainerConfig
    from kiln.core.errors import (
        EmptyWindowError,
        NonFiniteGradientError,
        NonFiniteLossError,
        NonFiniteWeightsError,
    )
    from kiln.core.launch import launch
    from kiln.core.loop import fit
    from kiln.core.optim import unpack_optimizers
    from kiln.core.rundir import CheckpointDirError, DamagedCheckpointError
    from kiln.core.seeding import rank_seed, weights_hash
    from kiln.core.state import FitResult
