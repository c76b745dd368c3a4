"""Rebuild a trained model from a checkpoint or a job dir (``kiln-export``, ``kiln-eval``).

A checkpoint holds the run's resolved config (``read_checkpoint_meta(path)["config"]``): the
model's registry name and arguments, its data and optimizer settings. That is all it takes
to rebuild the module and load the trained weights, with no other file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kiln.experiments.settings.job_info import TRAIN

EXPORT_FILE = "kiln_export.json"
"""What a kiln-export came from (checkpoint, step, run config), beside the library's files."""


def _job_checkpoint_dir(job_dir: Path) -> tuple[Path | None, bool]:
    """Where the kiln-train job in ``job_dir`` keeps its checkpoints, and whether its record
    says so: its recorded ``trainer.checkpoint_dir`` read where the job is now
    (:func:`kiln.experiments.jobs.job_paths.in_job`: a copied or moved job's own), else
    ``<job dir>/checkpoints``; ``None`` where the record turned checkpoints off."""
    from kiln.experiments.jobs.job_paths import in_job

    summary = job_dir / TRAIN.file
    if not summary.is_file():
        return job_dir / "checkpoints", False
    try:
        record = json.loads(summary.read_text())
    except (OSError, ValueError):
        return job_dir / "checkpoints", False
    trainer = ((record.get("config") or {}) if isinstance(record, dict) else {}).get("trainer")
    if not isinstance(trainer, dict) or "checkpoint_dir" not in trainer:
        return job_dir / "checkpoints", False
    configured = trainer["checkpoint_dir"]
    return (in_job(configured, job_dir, record) if configured else None), True


def resolve_checkpoint(source: str | Path) -> Path:
    """The checkpoint ``source`` names: a checkpoint file, a checkpoint directory (its newest
    intact checkpoint) or a kiln-train job dir (the newest checkpoint of its run, in the
    job's own checkpoint directory wherever the job now lies).

    Raises:
        FileNotFoundError: ``source`` does not exist or holds no checkpoint (a job copied
            without its checkpoints among them); the message says where it looked and what
            is valid.
    """
    from kiln.core.checkpoints.lookup import find_latest_checkpoint, missing_checkpoints

    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(
            f"{path} does not exist; give a checkpoint file (step-*.ckpt, best.ckpt), a "
            "checkpoint directory or a kiln-train job dir"
        )
    if path.is_file() or (path / "meta.pt").is_file():
        return path
    directory, recorded = _job_checkpoint_dir(path)
    if recorded and directory is None:
        raise FileNotFoundError(
            f"the job {path} was trained with trainer.checkpoint_dir=null: it has no "
            "checkpoint; give a checkpoint file, or train with checkpoints"
        )
    if recorded and directory is not None and not directory.is_dir():
        raise FileNotFoundError(
            f"the job {path} has no checkpoint directory: {directory}, where its record "
            "(summary.json, trainer.checkpoint_dir) keeps its checkpoints, is missing (a "
            "copy of the job without its checkpoints?); copy the job with its checkpoints, "
            "or give a checkpoint file"
        )
    looked = list(dict.fromkeys(d for d in (path, directory) if d is not None))
    for candidate in looked:
        found = find_latest_checkpoint(candidate) if candidate.is_dir() else None
        if found is not None:
            return found
    gone = [str(p) for d in looked if d.is_dir() for p in missing_checkpoints(d)]
    missing = f" (missing: {', '.join(gone)})" if gone else ""
    raise FileNotFoundError(
        f"no checkpoint found for {path}: looked in {', '.join(str(d) for d in looked)}"
        f"{missing}. Train with trainer.checkpoint_dir set, or give a checkpoint file"
    )


def load_trained_module(checkpoint: str | Path) -> tuple[Any, dict[str, Any]]:
    """The module ``checkpoint`` was trained as, with its trained weights, in eval mode.

    Returns:
        The module and the checkpoint's meta (``config``, ``global_step``, ``run_id``...).

    Raises:
        ValueError: The checkpoint holds no run config with a ``model``.

    The checkpoint, of any strategy, is read shard by shard into the module's own tensors
    in this one process: memory holds one copy of the model.
    """

    from kiln.core import load_weights, read_checkpoint_meta
    from kiln.experiments.settings.build import build_module, seed_before_build

    path = Path(checkpoint)
    meta = read_checkpoint_meta(path)
    config = meta.get("config") or {}
    if not config.get("model"):
        raise ValueError(
            f"checkpoint {path} records no model config (it was not written by kiln-train); "
            "only kiln-train checkpoints can be rebuilt without other files"
        )
    seed_before_build(config.get("trainer", {}).get("seed", 0))
    module = build_module(config)
    load_weights(module, path)
    return module.eval(), meta


def load_exported_module(export_dir: str | Path) -> tuple[Any, dict[str, Any]]:
    """The module a ``kiln-export`` directory holds, rebuilt from its ``kiln_export.json``
    (the run config) with the exported weights, in eval mode.

    Returns:
        The module and the export's record (``checkpoint``, ``global_step``, ``config``...).

    Raises:
        FileNotFoundError: ``export_dir`` has no ``kiln_export.json``.
    """
    from kiln.experiments.settings.build import build_module, seed_before_build

    record_file = Path(export_dir) / EXPORT_FILE
    if not record_file.is_file():
        raise FileNotFoundError(
            f"{export_dir} has no {EXPORT_FILE}: it was not written by kiln-export"
        )
    record = json.loads(record_file.read_text())
    config = record["config"]
    seed_before_build(config.get("trainer", {}).get("seed", 0))
    module = build_module(config)
    module.load_export(export_dir)
    return module.eval(), record
