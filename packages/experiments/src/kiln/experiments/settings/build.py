"""Build the LightningModule a resolved config describes (kiln-train's workers, kiln-bench)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kiln.experiments.settings.base import JobConfig


def build_module(cfg: JobConfig | Mapping[str, Any]) -> Any:
    """The LightningModule a config describes: plugins, data module, ``create_model``.

    Args:
        cfg: The job's validated config (a ``data`` field, where it has one, is the data
            module's ``_target_`` and arguments), or a resolved one read back from a file (a
            checkpoint's or an export's run config).

    The config's ``plugins`` are imported first: a worker process that ``kiln.core.launch``,
    torchrun or SLURM started has imported nothing of the user's yet.
    """

    from kiln.models import OptimizerConfig, SchedulerConfig, create_model
    from kiln.models.plugins import load_plugins

    if isinstance(cfg, Mapping):  # read from a file: only the typed config is checked
        model, data, plugins = cfg["model"], cfg.get("data"), cfg.get("plugins") or []
        optimizer = OptimizerConfig(**cfg["optimizer"])
        scheduler = SchedulerConfig(**cfg["scheduler"])
    else:
        model, data, plugins = cfg.model, getattr(cfg, "data", None), cfg.plugins
        optimizer, scheduler = cfg.optimizer, cfg.scheduler
    load_plugins(plugins)
    data_module = _data_module(data) if data else None
    return create_model(**model, data=data_module, optimizer=optimizer, scheduler=scheduler)


def _data_module(data: Any) -> Any:
    """``data`` instantiated; a value its data module refuses is named as the data module's
    (``data (TextClassificationData): batch_size=0 must be >= 1``), not wrapped in Hydra's
    "Error in call to target"."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    try:
        return instantiate(data, _convert_="all")
    except InstantiationException as error:
        cause = error.__cause__
        if not isinstance(cause, ValueError | TypeError):
            raise
        target = str(data.get("_target_", "?")).rsplit(".", 1)[-1]
        raise type(cause)(f"data ({target}): {cause}") from None


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
