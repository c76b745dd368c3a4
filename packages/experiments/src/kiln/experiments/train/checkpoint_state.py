"""A resumed job's stateful callbacks against the state its checkpoint holds, in the setup
stage.

Every checkpoint holds each stateful callback's state under ``"callbacks"`` and its key
(``kiln.core.callback_points``). A job re-run without a callback whose state the checkpoint
holds would drop that state from every later checkpoint, and one re-run with a callback the
checkpoint holds nothing for would start it fresh: :func:`check` refuses either here,
naming each key, before any W&B run opens (``kiln.core.fit`` refuses it too, with the same
words); with ``trainer.allow_changed_state=true`` the job goes on and its attempt records
what changed (``changed_state`` in ``attempts.json`` and the record's ``attempts``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.experiments.settings.job_files import write_job_json
from kiln.experiments.train.rerun import ATTEMPTS_FILE


def saved_callbacks(checkpoint: Path) -> list[str]:
    """The callback state keys ``checkpoint`` holds (its ``"callbacks"`` entry)."""
    import torch

    meta = checkpoint / "meta.pt" if checkpoint.is_dir() else checkpoint
    saved = torch.load(meta, map_location="cpu", mmap=True, weights_only=True)
    return list(saved.get("callbacks") or {})


def configured_callbacks(specs: dict[str, Any] | None) -> list[str]:
    """The state keys of the ``callbacks`` config group's stateful callbacks, from their
    classes (none is built here: a callback may do work when built)."""
    from hydra.utils import get_class

    from kiln.core.callback_points import is_stateful

    keys = []
    for spec in (specs or {}).values():
        if spec is None or "_target_" not in spec:
            continue  # a null entry drops one; no _target_ fails where they are built
        cls = get_class(spec["_target_"])
        if is_stateful(cls):
            keys.append(str(spec.get("state_key") or getattr(cls, "state_key", cls.__name__)))
    return keys


def check(
    settings: Any, checkpoint: Path | None, job_dir: str, attempts: list[dict[str, Any]]
) -> list[str]:
    """Compare the callbacks ``settings`` configures with the state ``checkpoint`` holds.

    Returns:
        What changed (``callbacks/<key> dropped``, ``callbacks/<key> started fresh``;
        empty when nothing did or the job starts fresh); with
        ``trainer.allow_changed_state=true`` also written into this attempt (the last of
        ``attempts``) as ``changed_state``.

    Raises:
        StateChangedError: They differ and ``trainer.allow_changed_state`` is false; the
            message names each key and the ways on.
    """
    from kiln.core import StateChangedError
    from kiln.core.checkpoints.registry import state_refusal

    if checkpoint is None:
        return []
    saved, now = saved_callbacks(checkpoint), configured_callbacks(settings.callbacks)
    dropped = [f"callbacks/{k}" for k in saved if k not in now]
    fresh = [f"callbacks/{k}" for k in now if k not in saved]
    if not dropped and not fresh:
        return []
    if not settings.trainer.allow_changed_state:
        raise StateChangedError(state_refusal(checkpoint, dropped, fresh))
    changed = [*(f"{k} dropped" for k in dropped), *(f"{k} started fresh" for k in fresh)]
    if attempts:
        attempts[-1]["changed_state"] = changed
        write_job_json(Path(job_dir) / ATTEMPTS_FILE, attempts)
    return changed
