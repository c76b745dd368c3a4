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


def _job_checkpoint_dirs(job_dir: Path) -> list[Path]:
    """Where a kiln-train job dir may keep its checkpoints: its configured
    ``trainer.checkpoint_dir`` (from ``summary.json``), then ``<job dir>/checkpoints``."""
    dirs = []
    summary = job_dir / TRAIN.file
    if summary.is_file():
        config = json.loads(summary.read_text()).get("config") or {}
        configured = (config.get("trainer") or {}).get("checkpoint_dir")
        if configured:
            dirs.append(Path(configured))
    dirs.append(job_dir / "checkpoints")
    return dirs


def resolve_checkpoint(source: str | Path) -> Path:
    """The checkpoint ``source`` names: a checkpoint file, a checkpoint directory (its newest
    intact checkpoint) or a kiln-train job dir (the newest checkpoint of its run).

    Raises:
        FileNotFoundError: ``source`` does not exist or holds no checkpoint; the message
            says where it looked and what is valid.
    """
    from kiln.core.checkpoints.lookup import find_latest_checkpoint

    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(
            f"{path} does not exist; give a checkpoint file (step-*.ckpt, best.ckpt), a "
            "checkpoint directory or a kiln-train job dir"
        )
    if path.is_file() or (path / "meta.pt").is_file():
        return path
    looked = [path, *_job_checkpoint_dirs(path)]
    for directory in looked:
        found = find_latest_checkpoint(directory) if directory.is_dir() else None
        if found is not None:
            return found
    raise FileNotFoundError(
        f"no checkpoint found for {path}: looked in {', '.join(str(d) for d in looked)}. "
        "Train with trainer.checkpoint_dir set, or give a checkpoint file"
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
