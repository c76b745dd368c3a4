"""Checkpoints: saving (``save.py``) and loading (``load.py``) the one format every strategy
writes, finding them and telling a damaged one (``lookup.py``), RNG state (``rng.py``),
checksums (``checksum.py``) and the directory one run owns (``rundir.py``).

Its public names (``__all__``) are what the other kiln packages use; they are imported on
first use, so importing this package imports nothing else.
"""

from typing import TYPE_CHECKING

from kiln.core.lazy import lazy_package

_EXPORTS = {
    "CheckpointDirError": "kiln.core.checkpoints.rundir",
    "CheckpointWriteError": "kiln.core.checkpoints.rundir",
    "CheckpointWrites": "kiln.core.checkpoints.save",
    "DamagedCheckpointError": "kiln.core.checkpoints.rundir",
    "check_not_a_plain_directory": "kiln.core.checkpoints.lookup",
    "check_writable": "kiln.core.checkpoints.rundir",
    "checkpoint_candidates": "kiln.core.checkpoints.lookup",
    "checkpoint_path": "kiln.core.checkpoints.lookup",
    "damage": "kiln.core.checkpoints.lookup",
    "find_latest_checkpoint": "kiln.core.checkpoints.lookup",
    "is_legacy": "kiln.core.checkpoints.lookup",
    "load_checkpoint": "kiln.core.checkpoints.load",
    "load_weights": "kiln.core.checkpoints.load",
    "plan_claim": "kiln.core.checkpoints.rundir",
    "read_checkpoint_meta": "kiln.core.checkpoints.load",
    "read_run_file": "kiln.core.checkpoints.rundir",
    "save_checkpoint": "kiln.core.checkpoints.save",
}
__all__ = [
    "CheckpointDirError",
    "CheckpointWriteError",
    "CheckpointWrites",
    "DamagedCheckpointError",
    "check_not_a_plain_directory",
    "check_writable",
    "checkpoint_candidates",
    "checkpoint_path",
    "damage",
    "find_latest_checkpoint",
    "is_legacy",
    "load_checkpoint",
    "load_weights",
    "plan_claim",
    "read_checkpoint_meta",
    "read_run_file",
    "save_checkpoint",
]
lazy_package(__name__, _EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see
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
