"""What a path given as a checkpoint may be: a file, or a sharded checkpoint's directory.

Kept out of ``checkpoint.py``: a directory that is neither (a checkpoint dir, a job dir)
is a user's slip, answered with what to pass instead.
"""

from __future__ import annotations

from pathlib import Path


def check_not_a_plain_directory(path: Path) -> None:
    """Refuse a directory that is no sharded checkpoint (a checkpoint dir, a job dir) given
    as a checkpoint, naming what to pass instead.

    Raises:
        IsADirectoryError: ``path`` is such a directory.
    """
    from kiln.core.checkpoints.checkpoint import checkpoint_candidates  # it imports this module

    if not path.is_dir() or (path / ".metadata").exists() or (path / "meta.pt").exists():
        return
    found = [d for d in (path, path / "checkpoints") if d.is_dir() and checkpoint_candidates(d)]
    if not found:
        raise IsADirectoryError(
            f"checkpoint {path} is a directory and holds no checkpoint (step-<N>.ckpt): pass "
            "a checkpoint file; to resume a run from its newest intact checkpoint, "
            "trainer.resume=auto with trainer.checkpoint_dir=<the directory holding them>"
        )
    directory = found[0]
    raise IsADirectoryError(
        f"checkpoint {path} is a directory, not a checkpoint: pass one of its checkpoint "
        f"files (newest: {checkpoint_candidates(directory)[0]}); to resume a run from its "
        f"newest intact checkpoint, trainer.resume=auto with trainer.checkpoint_dir={directory}"
    )
