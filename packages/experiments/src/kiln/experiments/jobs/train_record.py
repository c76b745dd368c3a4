"""The record of one kiln-train job: what ``summary.json`` holds, as a type.

The runner fills it (identity, the config's fields, then the ``fit`` result), the W&B summary
and the end-of-job table read from it, and ``kiln-report`` reads old and new files through
:meth:`TrainRecord.from_json` (a key a summary lacks takes its default; a key this kiln
does not know is kept in ``extra`` and written back as it was).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kiln.core.telemetry.records import Telemetry
from kiln.experiments.settings.dotted import select
from kiln.experiments.settings.job_info import JobMachine

FROM_FIT = {"from_fit": True}
"""The metadata of a field ``fit`` fills: copied from its result (``kiln.core.FitResult`` plus
the weights hash) into the record when training ends."""


NEWER = {"newer": True}
"""The metadata of a field a summary may lack: left out of the JSON while unset, so such a
summary reads and writes back unchanged."""


def _lookup(cfg: Any, key: str) -> Any:
    """``cfg``'s value at dotted ``key`` (``None`` where it is missing or does not resolve)."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        try:
            value = OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)
        except Exception:  # an interpolation that fails in a way select does not catch
            return None
        return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    return select(cfg, key)


@dataclass
class TrainRecord:
    """One kiln-train job's ``summary.json``."""

    # who the job is (kiln.experiments.settings.job_info.JobInfo.record)
    kind: str = "train"
    status: str = "failed"
    """``ok``, ``failed``, ``stopped`` (SIGTERM or Ctrl-C stopped it at a step boundary, with
    a checkpoint: a re-run resumes it) or ``requeued``."""
    error: str | None = None
    """The one-line reason of a failure."""
    error_stage: str | None = None
    """Where it failed: ``config``, ``setup``, ``train``."""
    overrides: list[str] = field(default_factory=list)
    job_name: str = "train"
    job_num: int = 0
    run_name: str | None = None
    output_dir: str | None = None
    sweep_dir: str | None = None
    # what it trains, read from the config before anything is built
    model: str | None = None
    model_tiny: bool = False
    precision: str | None = None
    compile_mode: str | None = None
    devices: int = 1
    """Devices over all nodes."""
    accumulate_grad_batches: int | None = None
    strategy: str | None = None
    """``trainer.strategy`` as configured (``auto``, ``ddp``, ``fsdp``)."""
    activation_checkpointing: bool = False
    seed: int | None = None
    # what fit returned
    init_weights_sha256: str | None = field(default=None, metadata=FROM_FIT)
    metrics: dict[str, float] = field(default_factory=dict, metadata=FROM_FIT)
    train_loss: float | None = field(default=None, metadata=FROM_FIT)
    global_step: int = field(default=0, metadata=FROM_FIT)
    stop_reason: str | None = field(default=None, metadata=FROM_FIT)
    """``max_steps``, ``max_epochs``, ``signal`` or a callback's reason."""
    stop_signal: str | None = field(default=None, metadata=FROM_FIT)
    """With ``stop_reason == "signal"``: the signal's name."""
    telemetry: Telemetry = field(default_factory=lambda: Telemetry(), metadata=FROM_FIT)
    history: list[dict[str, Any]] = field(default_factory=list, metadata=FROM_FIT)
    validation_history: list[dict[str, Any]] = field(default_factory=list, metadata=FROM_FIT)
    """Every validation's ``val/`` metrics with its ``step``, over all attempts."""
    checkpoint: str | None = field(default=None, metadata=FROM_FIT)
    best_checkpoint: dict[str, Any] | None = field(default=None, metadata=FROM_FIT)
    """With a ``BestCheckpoint`` callback: its file (``path``), the ``step`` it holds, the
    ``monitor``-ed metric and its ``value`` there."""
    profile: dict[str, Any] | None = field(default=None, metadata={**FROM_FIT, **NEWER})
    """With ``profile=steps``: the trace's path, the profiled ``steps`` and the ``breakdown``
    of a step's time (``kiln.core.telemetry.profile.StepBreakdown``)."""
    preemption: dict[str, Any] | None = field(default=None, metadata=NEWER)
    """When SLURM preempted this attempt: its ``partition``, the partition's ``preempt_mode``,
    ``hydra.launcher.preempt_requeue`` and whether kiln ``requeued`` the job
    (``kiln.experiments.launchers.slurm.preemption``)."""
    compile_trace: dict[str, Any] | None = None
    """With ``compile.trace=true``: where torch's trace and the tlparse report are kept."""
    # where and how it ran
    machine: JobMachine | None = None
    """The machine it ran on, with its calibrations and load
    (:func:`kiln.experiments.settings.job_info.machine_info`)."""
    wandb: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    """The resolved config."""
    attempts: list[dict[str, Any]] | None = None
    traceback_file: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Keys of the file this kiln does not know (a report adds ``job_dir``)."""

    CONFIG_KEYS: ClassVar[dict[str, str]] = {
        "model": "model.name",
        "model_tiny": "model.tiny",
        "precision": "trainer.precision",
        "compile_mode": "compile.mode",
        "accumulate_grad_batches": "trainer.accumulate_grad_batches",
        "strategy": "trainer.strategy",
        "activation_checkpointing": "trainer.activation_checkpointing",
        "seed": "trainer.seed",
    }
    """The fields read from the job's config, by config key."""
    PROGRESS: ClassVar[tuple[str, ...]] = (
        "global_step",
        "history",
        "validation_history",
        "train_loss",
    )
    """What a failed ``fit`` had completed (read from its exception)."""
    SUMMARY_SCALARS: ClassVar[tuple[str, ...]] = (
        "global_step",
        "stop_reason",
        "stop_signal",
        "train_loss",
        "seed",
        "init_weights_sha256",
    )
    """The plain entries of the record the W&B run's summary holds."""

    @classmethod
    def config_fields(cls, cfg: Any) -> dict[str, Any]:
        """The record's entries the job's config decides (:attr:`CONFIG_KEYS`, and
        ``devices`` over all nodes).

        Args:
            cfg: The validated ``TrainConfig``, or the raw ``DictConfig`` of a job whose
                config does not validate: what does resolve is recorded, the rest is ``None``.
        """
        found = {name: _lookup(cfg, key) for name, key in cls.CONFIG_KEYS.items()}
        nodes = _lookup(cfg, "trainer.num_nodes") or 1
        return {
            **found,
            "model_tiny": bool(found["model_tiny"]),
            "activation_checkpointing": bool(found["activation_checkpointing"]),
            "devices": (_lookup(cfg, "trainer.devices") or 1) * nodes,
        }

    @classmethod
    def fit_fields(cls) -> tuple[str, ...]:
        """The fields copied from ``fit``'s result."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("from_fit"))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrainRecord:
        """The record a ``summary.json`` holds (any kiln's: missing keys take defaults).

        Raises:
            ValueError: ``data`` is not a JSON object.
        """
        if not isinstance(data, dict):
            raise ValueError(f"a summary.json holds a JSON object, not {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        own = {k: v for k, v in data.items() if k in known}
        return cls(**own, extra={k: v for k, v in data.items() if k not in known})

    def to_json(self) -> dict[str, Any]:
        """The record as ``summary.json`` holds it (``extra`` merged back in)."""
        out = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name != "extra" and not (f.metadata.get("newer") and getattr(self, f.name) is None)
        }
        return {**out, **self.extra}

    @classmethod
    def fit_values(cls, result: dict[str, Any]) -> dict[str, Any]:
        """The record's entries from what ``fit`` returned (``FitResult`` as a dict, plus
        ``init_weights_sha256``)."""
        newer = {f.name for f in dataclasses.fields(cls) if f.metadata.get("newer")}
        return {
            name: result[name]
            for name in cls.fit_fields()
            if not (name in newer and result[name] is None)  # left out while unset
        }

    @classmethod
    def progress(cls, result: Any) -> dict[str, Any]:
        """:attr:`PROGRESS` of a ``FitResult`` (or anything with those attributes) that are set."""
        found = {k: getattr(result, k, None) for k in cls.PROGRESS}
        return {k: v for k, v in found.items() if v is not None}
