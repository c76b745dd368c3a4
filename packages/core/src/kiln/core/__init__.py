"""kiln.core: a plain Lightning Fabric loop that gets accumulation, precision, compile and
checkpoints exactly right. It knows nothing of HF, TIMM, Hydra or W&B."""

from kiln.core.config import COMPILE_MODES, PRECISIONS, CompileConfig, TrainerConfig
from kiln.core.launch import launch
from kiln.core.loop import (
    EmptyWindowError,
    FitResult,
    NonFiniteGradientError,
    NonFiniteLossError,
    fit,
)
from kiln.core.seeding import rank_seed, weights_hash

__all__ = [
    "COMPILE_MODES",
    "PRECISIONS",
    "CompileConfig",
    "EmptyWindowError",
    "FitResult",
    "NonFiniteGradientError",
    "NonFiniteLossError",
    "TrainerConfig",
    "fit",
    "launch",
    "rank_seed",
    "weights_hash",
]
