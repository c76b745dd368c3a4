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
    "check_global_batch": "kiln.core.config",
    "atomic_write": "kiln.core.atomic",
    "require": "kiln.core.optional",
    "lazy_package": "kiln.core.lazy",
    "EmptyWindowError": "kiln.core.errors",
    "NonFiniteGradientError": "kiln.core.errors",
    "NonFiniteLossError": "kiln.core.errors",
    "NonFiniteWeightsError": "kiln.core.errors",
    "launch": "kiln.core.distributed.launch",
    "fit": "kiln.core.loop.fit",
    "unpack_optimizers": "kiln.core.loop.optim",
    "CheckpointDirError": "kiln.core.checkpoints.rundir",
    "DamagedCheckpointError": "kiln.core.checkpoints.rundir",
    "rank_seed": "kiln.core.loop.seeding",
    "weights_hash": "kiln.core.loop.seeding",
    "FitResult": "kiln.core.state",
    "PrecisionAudit": "kiln.core.loop.precision_audit",
    "precision_audit": "kiln.core.loop.precision_audit",
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
    "PrecisionAudit",
    "TrainerConfig",
    "atomic_write",
    "check_global_batch",
    "fit",
    "launch",
    "lazy_package",
    "precision_audit",
    "rank_seed",
    "require",
    "unpack_optimizers",
    "weights_hash",
]
lazy_package(__name__, _EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see
    from kiln.core.atomic import atomic_write
    from kiln.core.checkpoints.rundir import CheckpointDirError, DamagedCheckpointError
    from kiln.core.config import (
        COMPILE_MODES,
        PRECISIONS,
        CompileConfig,
        TrainerConfig,
        check_global_batch,
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
    from kiln.core.loop.precision_audit import PrecisionAudit, precision_audit
    from kiln.core.loop.seeding import rank_seed, weights_hash
    from kiln.core.optional import require
    from kiln.core.state import FitResult
