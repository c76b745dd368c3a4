"""The config dataclasses every kiln job shares: paths, logger, and the base of a job's config.

``kiln-train``'s :class:`~kiln.experiments.train.train_config.TrainConfig` and ``kiln-bench``'s
:class:`~kiln.experiments.bench.bench_config.BenchConfig` extend :class:`JobConfig`, so a field
both read is declared (and documented) once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from kiln.core import CompileConfig, TrainerConfig
from kiln.models import OptimizerConfig, SchedulerConfig

BACKENDS = ("wandb", "csv", "none")
WANDB_MODES = ("offline", "online", "disabled")


@dataclass
class PathsConfig:
    """Where things go (the ``paths`` group)."""

    log_dir: str = "outputs"
    """Root of all run and sweep directories (``KILN_LOG_DIR``)."""
    output_dir: str | None = "${hydra:runtime.output_dir}"
    """The running job's own directory (``None`` outside a job, e.g. ``--cfg job --resolve``)."""
    corpus_dir: str = "${oc.env:KILN_CORPUS,${oc.env:KILN_CACHE,${oc.env:HOME}/.cache/kiln}/corpus}"
    """The shards and tokenizer ``scripts/make_corpus.py`` writes (``data=lm_corpus``;
    ``KILN_CORPUS``)."""


@dataclass
class LoggerConfig:
    """Where a job's metrics go (the ``logger`` config group)."""

    backend: str = "wandb"
    """``wandb`` (one W&B run per job), ``csv`` (``<job dir>/csv/metrics.csv``) or ``none``."""
    mode: str = "offline"
    """W&B mode: ``offline`` (sync later with ``wandb sync``), ``online`` or ``disabled``."""
    project: str = "kiln"
    """W&B project."""
    entity: str | None = None
    """W&B entity (user or team); ``None`` uses your default."""
    group: str | None = None
    """W&B group; ``None`` groups the jobs of a sweep together (``<sweep>/<sweep dir>``)."""
    job_type: str = "train"
    """W&B job type (``train``, ``bench``, ...)."""
    tags: list[str] = field(default_factory=list)
    """Extra tags, added to the automatic model/precision/compile/devices tags."""
    notes: str | None = None
    """Free-text notes on the run."""
    console: str = "off"
    """W&B console capture: ``off``, ``wrap``, ``redirect`` or ``auto``."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(
                f"logger.backend={self.backend!r} is not valid; "
                f"choose one of: {', '.join(BACKENDS)}"
            )
        if self.mode not in WANDB_MODES:
            raise ValueError(
                f"logger.mode={self.mode!r} is not valid; choose one of: {', '.join(WANDB_MODES)}"
            )


def open_model_node() -> DictConfig:
    """The ``model`` node: not struct, so the model's own arguments (not known to the schema,
    they differ per model) are set on the command line without ``+``."""
    return OmegaConf.create({}, flags={"struct": False})


@dataclass
class JobConfig:
    """What every kiln job's config holds: the model, how it steps, where it logs and writes."""

    model: Any = field(default_factory=open_model_node)
    """Keyword arguments of ``kiln.models.create_model`` (``name`` plus model options).
    Open: ``model.tiny=true`` or any argument of the model's factory overrides without
    ``+``; ``create_model`` refuses an argument the model lacks (naming the valid ones)
    before training starts."""
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
    """Print the config before the job starts."""
    repeat: int = 0
    """Which repeat of its configuration this job is: ``-m compile=none,default
    repeat=range(3)`` runs each configuration 3 times, interleaved (A B A B A B, whatever
    the order on the command line: :mod:`kiln.experiments.settings.repeats`); kiln-report pools a
    configuration's repeats and bootstraps across them."""
    plugins: list[str] = field(default_factory=list)
    """Modules (or ``module:callable``) to import before the model is built, in every
    process of the job: a user's package that registers models (``kiln.models.plugins``)."""


def check_known_keys(cfg: DictConfig, prefix: str = "") -> None:
    """Refuse a key that a typed node's dataclass does not declare: Hydra's ``+key=value``
    (the fix its own error suggests for a typo) adds one to a typed node, and
    ``OmegaConf.to_object`` then sets it on the dataclass, where nothing reads it.

    Args:
        cfg: A composed config (a node of it, below ``prefix``).
        prefix: The dotted path of ``cfg``.

    Raises:
        ValueError: Names the key, the closest valid ones and where to find them all.
    """
    import dataclasses
    import difflib

    kind = OmegaConf.get_type(cfg)
    if not (isinstance(kind, type) and dataclasses.is_dataclass(kind)):
        return  # an Any-typed node (model, data): its own code refuses what it lacks
    fields = {f.name for f in dataclasses.fields(kind)}
    for key in cfg.keys():
        name = f"{prefix}{key}"
        if key not in fields:
            close = difflib.get_close_matches(str(key), sorted(fields), n=3)
            hint = f"did you mean {' or '.join(prefix + c for c in close)}? " if close else ""
            raise ValueError(
                f"{name} is not a config key ({kind.__name__} has no field {key!r}, so nothing "
                f"would read it): {hint}valid keys of {prefix.rstrip('.') or 'the config'}: "
                f"{', '.join(sorted(fields))}"
            )
        node = cfg._get_node(key)  # pyright: ignore[reportPrivateUsage]  (no resolution)
        if isinstance(node, DictConfig):
            check_known_keys(node, f"{name}.")
