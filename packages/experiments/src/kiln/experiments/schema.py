"""The structured config of ``kiln-train``: dataclasses registered in Hydra's ConfigStore.

``configs/train.yaml`` starts its defaults list with ``train_schema``, so every group
(``trainer``, ``compile``, ``optimizer``, ``scheduler``, ``logger``, ``paths``) merges into a
typed node: an unknown key or a value of the wrong type fails at compose time, naming the
key. Range checks live in each dataclass's ``__post_init__`` and run in :func:`validate`,
before any work starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from kiln.core import CompileConfig, TrainerConfig
from kiln.experiments.resolvers import register_resolvers
from kiln.experiments.tracking import LoggerConfig
from kiln.models import OptimizerConfig, SchedulerConfig


@dataclass
class PathsConfig:
    """Where things go (the ``paths`` group)."""

    log_dir: str = "outputs"
    """Root of all run and sweep directories (``KILN_LOG_DIR``)."""
    output_dir: str | None = "${hydra:runtime.output_dir}"
    """The running job's own directory (``None`` outside a job, e.g. ``--cfg job --resolve``)."""


@dataclass
class TrainConfig:
    """Everything one ``kiln-train`` job needs."""

    model: Any = MISSING
    """Keyword arguments of ``kiln.models.create_model`` (``name`` plus model options)."""
    data: Any = None
    """A data module to instantiate (``_target_`` plus its arguments), or ``None``."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    compile: CompileConfig = field(default_factory=CompileConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    name: str = "default"
    """The experiment's name (set by ``experiment=`` files)."""
    tags: list[str] = field(default_factory=list)
    """Extra W&B tags for the run."""
    print_config: bool = False
    """Print the resolved config before training."""


def register_configs() -> None:
    """Register ``train_schema`` (the typed base of ``configs/train.yaml``)."""
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)
    register_resolvers()  # ${kiln_if_cuda:...} in configs/launcher


def validate(cfg: DictConfig) -> TrainConfig:
    """Build the dataclasses from ``cfg``, running every ``__post_init__`` check.

    Raises:
        ValueError: A value is out of range; the message names the key and what is valid.
    """
    settings = OmegaConf.to_object(cfg)
    assert isinstance(settings, TrainConfig), type(settings)
    return settings
