"""A resumed job's data against what its checkpoint was trained on, in the setup stage.

Every checkpoint records the data's fingerprint (entry ``"data"``:
``kiln.models.data.fingerprint``). Once the setup stage has built the data, :func:`check`
reads the checkpoint's record and compares: a change is refused there, naming each file
added, removed or changed, before any W&B run opens; with ``data.allow_changed=true`` the job
goes on and its attempt records what changed (``data_changed`` in ``attempts.json`` and the
record's ``attempts``; kiln-report lists it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.experiments.settings.job_files import write_job_json
from kiln.experiments.train.rerun import ATTEMPTS_FILE


def saved_record(checkpoint: Path) -> dict[str, Any] | None:
    """The ``"data"`` entry of ``checkpoint`` (``None``: it records no data)."""
    import torch

    meta = checkpoint / "meta.pt" if checkpoint.is_dir() else checkpoint
    saved = torch.load(meta, map_location="cpu", mmap=True, weights_only=True)
    return saved.get("data")


def check(
    module: Any, checkpoint: Path | None, job_dir: str, attempts: list[dict[str, Any]]
) -> list[str]:
    """Compare the data ``module``'s data module feeds now with ``checkpoint``'s record.

    Returns:
        What changed (empty when nothing did, when the job starts fresh, or when the
        checkpoint records no data); with ``data.allow_changed=true`` also written into this
        attempt (the last of ``attempts``) as ``data_changed``.

    Raises:
        DataChangedError: The data changed and ``data.allow_changed`` is false; the message
            names each change and the ways on.
    """
    from kiln.models.data.fingerprint import DataChangedError, changes, refusal

    data = getattr(module, "data_module", None)
    if checkpoint is None or data is None or not hasattr(data, "data_fingerprint"):
        return []
    saved = saved_record(checkpoint)
    if saved is None:
        return []  # the resume says so (the entry's load_missing)
    found = changes(saved, data.data_fingerprint())
    if found and not data.allow_changed:
        raise DataChangedError(refusal(found, str(checkpoint)))
    if found and attempts:
        attempts[-1]["data_changed"] = found
        write_job_json(Path(job_dir) / ATTEMPTS_FILE, attempts)
    return found
