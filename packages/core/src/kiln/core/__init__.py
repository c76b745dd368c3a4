"""kiln.core: a plain Lightning Fabric loop that gets accumulation, precision, compile and
checkpoints exactly right. It knows nothing of HF, TIMM, Hydra or W&B."""

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
