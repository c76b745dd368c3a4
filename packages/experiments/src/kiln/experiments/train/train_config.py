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
    """Register ``train_schema`` (the typed base of ``configs/train.yaml``), and
    :func:`check_job` as the check a sweep runs on each job before the first starts."""
    from kiln.experiments.jobs.sweep_check import register_job_check

    ConfigStore.instance().store(name="train_schema", node=TrainConfig)
    register_resolvers()  # ${kiln_if_cuda:...} in configs/launcher
    register_job_check("train", check_job)


def check_job(cfg: DictConfig) -> TrainConfig:
    """The config stage's checks of one job that read nothing of its job directory (the
    resume and the checkpoint directory are the job's own to check): a sweep runs it on every
    job before the first starts (:mod:`kiln.experiments.jobs.sweep_check`). Warnings are
    left to the job.

    Raises:
        ValueError: As :func:`validate`, or the machine cannot run it
            (:func:`kiln.experiments.train.preflight.check_machine`), or an explicit
            ``trainer.resume`` with ``trainer.checkpoint_dir=null``.
    """
    from kiln.experiments.train import preflight, rerun

    if OmegaConf.select(cfg, "trainer.checkpoint_dir") is None:
        rerun.check_resume_without_dir(OmegaConf.select(cfg, "trainer.resume"))
    settings = validate(cfg, warn=False)
    preflight.check_machine(settings)
    return settings


def validate(cfg: DictConfig, warn: bool = True) -> TrainConfig:
    """Build the dataclasses from ``cfg``, running every ``__post_init__`` check, then check
    the groups without a schema (``data``, ``callbacks``, ``model``) against what reads them,
    the model against the data, and (``warn``) warn about settings a run cannot honour.

    Raises:
        ValueError: A value is out of range or of the wrong type, a key the schema or the
            group's target does not know was added (``+trainer.max_step=5``), or the model
            and data do not fit; the message names the key and what is valid.
    """
    from kiln.experiments.settings.pairs import check_model_fits_data
    from kiln.experiments.settings.typed import check_groups
    from kiln.experiments.tracking.tracker import import_early
    from kiln.experiments.train.worker import global_rank
    from kiln.models.plugins import load_plugins

    check_known_keys(cfg)
    settings = OmegaConf.to_object(cfg)
    assert isinstance(settings, TrainConfig), type(settings)
    if global_rank() == 0:
        import_early(settings.logger)  # before the model registry imports the models
    load_plugins(settings.plugins)  # their models and data modules
    check_groups(settings)
    check_model_fits_data(settings.model, settings.data)
    check_combinations(settings)
    if warn:
        warn_about(settings)
    return settings


def check_combinations(settings: TrainConfig) -> None:
    """Refuse settings that are each valid but fail together, before anything is built.

    Raises:
        ValueError: ``data.streaming`` with ``trainer.max_epochs``, or ``data.packing`` with
            an attention that cannot take packed rows' document mask.
    """
    data = settings.data or {}
    trainer = settings.trainer
    if data.get("streaming") is True and trainer.max_epochs is not None:
        raise ValueError(
            f"trainer.max_epochs={trainer.max_epochs} cannot end a run on a stream "
            "(data.streaming=true has no epoch length); set trainer.max_epochs=null and train "
            "for trainer.max_steps"
        )
    attention = (settings.model or {}).get("attn_implementation")
    if data.get("packing") is True and attention is not None:
        from kiln.models.hf import PACKING_ATTENTION

        if attention not in PACKING_ATTENTION:
            raise ValueError(
                "data.packing=true needs attention that takes a 4-D document mask; "
                f"model.attn_implementation={attention!r} does not. Use one of: "
                f"{', '.join(PACKING_ATTENTION)}, or set data.packing=false"
            )


def warn_about(settings: TrainConfig) -> None:
    """Warn, one line each, about settings a run takes but cannot honour: more intra-op
    threads than cores, a step-time warm-up as long as the run, a profile longer than it."""
    import logging

    from kiln.core.telemetry.machine import usable_cores

    log = logging.getLogger(__name__)
    trainer = settings.trainer
    threads = trainer.threads_per_rank
    ranks = trainer.devices  # the ranks on this node, each with its own threads
    cores = usable_cores(ranks)
    if isinstance(threads, int) and threads * ranks > cores:
        log.warning(
            f"trainer.threads_per_rank={threads}: {threads * ranks} threads ({ranks} rank(s)) "
            f"on the {cores} cores this process may use share them and step slower; use "
            "trainer.threads_per_rank=auto (cores // ranks)"
        )
    if 0 < trainer.max_steps <= trainer.warmup_steps:
        log.warning(
            f"trainer.warmup_steps={trainer.warmup_steps} is not fewer than "
            f"trainer.max_steps={trainer.max_steps}: no step is left after the warm-up, so the "
            "step times measure every step (compilation included); lower trainer.warmup_steps"
        )
    profile = settings.profile
    if profile is not None:
        needed = profile.wait + profile.warmup + profile.active
        if trainer.max_steps < needed:
            log.warning(
                f"profile=steps needs {needed} steps (profile.wait={profile.wait} + "
                f"warmup={profile.warmup} + active={profile.active}), the run has "
                f"trainer.max_steps={trainer.max_steps}: no trace will be written; lower them "
                "or raise trainer.max_steps"
            )
