"""The structured config of ``kiln-train``: a dataclass registered in Hydra's ConfigStore.

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
from omegaconf import DictConfig, OmegaConf

from kiln.core import CompileConfig, ProfileConfig
from kiln.experiments.settings.base import JobConfig, check_known_keys
from kiln.experiments.settings.resolvers import register_resolvers
from kiln.experiments.train.objective import OptimizedMetric

COMPILE_CACHE_DIR = "${paths.log_dir}/inductor_cache"
"""Where kiln-train keeps inductor's on-disk caches by default: one directory per log dir,
so the jobs of a sweep and re-runs compile each graph once (``compile.cache_dir=null``:
torch's own settings). kiln-bench keeps its cold compile."""


def _train_compile() -> CompileConfig:
    return CompileConfig(cache_dir=COMPILE_CACHE_DIR)


@dataclass
class TrainConfig(JobConfig):
    """Everything one ``kiln-train`` job needs (the fields of :class:`JobConfig`, plus data)."""

    compile: CompileConfig = field(default_factory=_train_compile)
    """As :class:`JobConfig`'s, with inductor's caches shared below ``paths.log_dir``."""

    data: Any = None
    """A data module to instantiate (``_target_`` plus its arguments), or ``None``."""
    callbacks: dict[str, Any] | None = None
    """``kiln.core.fit`` callbacks by name, each ``_target_`` plus its arguments (the
    ``callbacks`` config group; a ``null`` entry drops one)."""
    profile: ProfileConfig | None = None
    """``torch.profiler`` over a few steps (the ``profile`` config group; ``None``: off)."""
    optimized_metric: OptimizedMetric = field(default_factory=OptimizedMetric)
    """The metric the job returns to Hydra's sweeper (``hparams_search=`` studies)."""
    test_after_fit: bool = False
    """After training, run the data module's test split through the model's metrics
    (``test/<metric>`` in ``summary.json`` and the W&B run); the data needs a test split."""


def register_configs() -> None:
    """Register ``train_schema`` (the typed base of ``configs/train.yaml``)."""
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)
    register_resolvers()  # ${kiln_if_cuda:...} in configs/launcher


def validate(cfg: DictConfig) -> TrainConfig:
    """Build the dataclasses from ``cfg``, running every ``__post_init__`` check.

    Raises:
        ValueError: A value is out of range, or a key the schema does not know was added
            (``+trainer.max_step=5``); the message names the key and what is valid.
    """
    check_known_keys(cfg)
    settings = OmegaConf.to_object(cfg)
    assert isinstance(settings, TrainConfig), type(settings)
    return settings
