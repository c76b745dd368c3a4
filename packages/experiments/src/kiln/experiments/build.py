"""Build the LightningModule a resolved config describes (kiln-train's workers, kiln-bench)."""

from __future__ import annotations

from typing import Any


def build_module(resolved: dict[str, Any]) -> Any:
    """The LightningModule a resolved config describes: plugins, data module, ``create_model``.

    The config's ``plugins`` are imported first: a worker process that ``kiln.core.launch``,
    torchrun or SLURM started has imported nothing of the user's yet.
    """
    from hydra.utils import instantiate

    from kiln.models import OptimizerConfig, SchedulerConfig, create_model
    from kiln.models.plugins import load_plugins

    load_plugins(resolved.get("plugins") or [])

    data = instantiate(resolved["data"], _convert_="all") if resolved.get("data") else None
    optimizer = OptimizerConfig(**resolved["optimizer"])
    scheduler = SchedulerConfig(**resolved["scheduler"])
    return create_model(**resolved["model"], data=data, optimizer=optimizer, scheduler=scheduler)


def seed_before_build(seed: int) -> None:
    """Seed python, numpy and torch (every device) before the data and model are built.

    ``kiln.core.fit`` seeds again after building, but by then the weights are drawn: without
    this, every process starts from its own random weights, and in a sweep run in one
    process a job's weights depend on what the jobs before it drew.
    """
    from lightning.fabric.utilities.seed import seed_everything

    seed_everything(seed, verbose=False)


def model_label(model: dict[str, Any]) -> str:
    """The model's ``name``, with its ``arch`` for generic wrappers (``timm:resnet18``)."""
    name = str(model.get("name", "?"))
    return f"{name}:{model['arch']}" if model.get("arch") else name
