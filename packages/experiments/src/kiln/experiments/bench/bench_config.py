"""The structured config of ``kiln-bench``: how a benchmark measures, registered in Hydra."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from kiln.experiments.settings.base import JobConfig, check_known_keys
from kiln.experiments.settings.resolvers import register_resolvers


@dataclass
class BenchSettings:
    """How a benchmark measures (the ``bench`` node of ``configs/bench.yaml``)."""

    batch_size: int | None = 8
    """Samples in the fixed batch (``module.example_batch(batch_size)``); ``None``: the
    model's own (a PyTorch suite model's list batch size, see ``sweep=pt2_hf``)."""
    warmup: int = 3
    """Steps of each variant after the first (compiling) one, before timing."""
    repeats: int = 20
    """Timed eager/compiled pairs (A B A B ...); medians and spread come from these."""
    memory_steps: int = 2
    """Extra steps of each variant whose largest peak is its peak memory (0: skip)."""
    cold_compile: bool = True
    """Compile without inductor's on-disk caches, so ``compile_time_s`` is a first run's."""
    profile_steps: int = 0
    """After timing, profile this many steps of each variant (one trace each in the job dir,
    a breakdown each in bench.json's ``profile``); 0: no profile."""
    tolerance: float | None = None
    """Accepted relative error of loss and gradients; ``None``: by precision (1e-4 for
    32-true, 1e-2 for 16-mixed, 2e-2 for bf16-mixed)."""

    def __post_init__(self) -> None:
        for name, value, low in (
            *([("batch_size", self.batch_size, 1)] if self.batch_size is not None else []),
            ("warmup", self.warmup, 0),
            ("repeats", self.repeats, 1),
            ("memory_steps", self.memory_steps, 0),
            ("profile_steps", self.profile_steps, 0),
        ):
            if not isinstance(value, int) or value < low:
                raise ValueError(
                    f"bench.{name}={value!r} is not valid; it must be an integer >= {low}"
                )
        if self.tolerance is not None and not (
            self.tolerance > 0 and math.isfinite(self.tolerance)
        ):
            raise ValueError(
                f"bench.tolerance={self.tolerance!r} is not valid; use a positive "
                "float, or null for the precision's default"
            )


@dataclass
class BenchConfig(JobConfig):
    """Everything one ``kiln-bench`` job needs (the typed base of ``configs/bench.yaml``).

    Of ``trainer`` only ``precision`` (the ``precision`` group sets it), ``accelerator`` and
    ``seed`` are used; ``data`` is not a field: a benchmark steps on one fixed batch.
    """

    name: str = "bench"
    """The benchmark's name."""
    bench: BenchSettings = field(default_factory=BenchSettings)


def register_configs() -> None:
    """Register ``bench_schema`` (the typed base of ``configs/bench.yaml``), kiln's
    resolvers (``${kiln_pt2_models:hf}`` in the suite sweeps), and :func:`validate` as the
    check a sweep runs on each job before the first starts."""
    from kiln.experiments.jobs.sweep_check import register_job_check

    register_resolvers()
    ConfigStore.instance().store(name="bench_schema", node=BenchConfig)
    register_job_check("bench", validate)


def validate(cfg: DictConfig) -> BenchConfig:
    """A benchmark job's config stage: build the dataclasses from ``cfg``, running every
    ``__post_init__`` check.

    Raises:
        ValueError: A key the schema does not know was added (``+bench.repeat=5``), or a
            value is out of range; the message names the key and what is valid.
    """
    check_known_keys(cfg)  # a +key the schema lacks would be set and never read
    settings = OmegaConf.to_object(cfg)  # runs every __post_init__ check
    assert isinstance(settings, BenchConfig), type(settings)
    return settings
