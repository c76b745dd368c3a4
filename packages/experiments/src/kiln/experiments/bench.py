"""``kiln-bench``: eager against ``torch.compile`` training steps of one model, one Hydra job.

Each job benchmarks one model x precision x compile mode (see
:mod:`kiln.experiments.bench_harness` for the method), writes ``bench.json`` into its
output directory and logs one W&B run. A model that fails the accuracy check or raises is
a row with status ``fail`` or ``error`` and its reason; the sweep goes on.

Examples::

    kiln-bench                                        # tiny BERT, compile=default, 32-true
    kiln-bench -m precision=32-true,bf16-mixed        # about a minute on the CPU
    kiln-bench -m model=bert-tiny-cls,vit-tiny compile=none,default
    kiln-bench -m sweep=bench_hf                      # a dozen HF architectures (GPU-sized)
    kiln-report multirun/<date>/<time>                # the speedup table of a sweep
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from kiln.core import CompileConfig, TrainerConfig
from kiln.experiments.job import JobInfo, machine_info, write_job_json
from kiln.experiments.schema import PathsConfig
from kiln.experiments.tracking import LoggerConfig, Tracker
from kiln.models import OptimizerConfig, SchedulerConfig

log = logging.getLogger(__name__)

BENCH_FILE = "bench.json"


@dataclass
class BenchSettings:
    """How a benchmark measures (the ``bench`` node of ``configs/bench.yaml``)."""

    batch_size: int = 8
    """Samples in the fixed batch (``module.example_batch(batch_size)``)."""
    warmup: int = 3
    """Steps of each variant after the first (compiling) one, before timing."""
    repeats: int = 20
    """Timed eager/compiled pairs (A B A B ...); medians and spread come from these."""
    memory_steps: int = 2
    """Extra steps of each variant whose largest peak is its peak memory (0: skip)."""
    cold_compile: bool = True
    """Compile without inductor's on-disk caches, so ``compile_time_s`` is a first run's."""
    tolerance: float | None = None
    """Accepted relative error of loss and gradients; ``None``: by precision (1e-4 for
    32-true, 1e-2 for 16-mixed, 2e-2 for bf16-mixed)."""

    def __post_init__(self) -> None:
        for name, value, low in (
            ("batch_size", self.batch_size, 1),
            ("warmup", self.warmup, 0),
            ("repeats", self.repeats, 1),
            ("memory_steps", self.memory_steps, 0),
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
class BenchConfig:
    """Everything one ``kiln-bench`` job needs (the typed base of ``configs/bench.yaml``)."""

    model: Any = MISSING
    """Keyword arguments of ``kiln.models.create_model`` (``name`` plus model options)."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Only ``precision`` (the ``precision`` group sets it), ``accelerator``, ``seed`` are used."""
    compile: CompileConfig = field(default_factory=CompileConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    bench: BenchSettings = field(default_factory=BenchSettings)
    name: str = "bench"
    """The benchmark's name."""
    tags: list[str] = field(default_factory=list)
    """Extra W&B tags for the run."""
    print_config: bool = False
    """Print the resolved config first."""


def register_configs() -> None:
    """Register ``bench_schema`` (the typed base of ``configs/bench.yaml``)."""
    ConfigStore.instance().store(name="bench_schema", node=BenchConfig)


def model_label(model: dict[str, Any]) -> str:
    """The model's ``name``, with its ``arch`` for generic wrappers (``timm:resnet18``)."""
    name = str(model.get("name", "?"))
    return f"{name}:{model['arch']}" if model.get("arch") else name


def measure(settings: BenchConfig, resolved: dict[str, Any]) -> dict[str, Any]:
    """Build the model and its fixed batch, then run the harness; never raises."""
    from kiln.experiments.bench_harness import run_benchmark
    from kiln.experiments.runner import build_module

    try:
        module = build_module({**resolved, "data": None})
        batch = module.example_batch(settings.bench.batch_size)
    except Exception as exc:  # a model that cannot be built is a row, not a crashed sweep
        return {"status": "error", "reason": f"build model: {type(exc).__name__}: {exc}"}
    return run_benchmark(
        module,
        batch,
        precision=settings.trainer.precision,
        compile=settings.compile,
        accelerator=settings.trainer.accelerator,
        warmup=settings.bench.warmup,
        repeats=settings.bench.repeats,
        memory_steps=settings.bench.memory_steps,
        tolerance=settings.bench.tolerance,
        seed=settings.trainer.seed,
        cold_compile=settings.bench.cold_compile,
    )


def _log(tracker: Tracker, record: dict[str, Any]) -> None:
    """Per-pair step times as W&B history, the scalar results as the run's summary."""
    pairs = zip(
        record.get("eager_times_s") or [], record.get("compiled_times_s") or [], strict=True
    )
    for i, (eager, compiled) in enumerate(pairs):
        for logger in tracker.loggers:
            logger.log_metrics(
                {
                    "bench/eager_step_s": eager,
                    "bench/compiled_step_s": compiled,
                    "bench/ratio": eager / compiled,
                },
                step=i,
            )
    keys = (
        "status",
        "reason",
        "speedup",
        "speedup_p25",
        "speedup_p75",
        "speedup_ci_low",
        "speedup_ci_high",
        "significant",
        "eager_median_s",
        "compiled_median_s",
        "compile_time_s",
        "dynamo_compile_time_s",
        "memory_eager_mb",
        "memory_compiled_mb",
        "memory_ratio",
        "graph_breaks",
        "recompiles",
        "accuracy",
    )
    tracker.summarize({"bench": {k: record.get(k) for k in keys}})


def run_bench_job(cfg: DictConfig, job: JobInfo) -> dict[str, Any]:
    """One benchmark job: measure, log to W&B, write ``bench.json``; returns the record."""
    settings = OmegaConf.to_object(cfg)  # runs every __post_init__ check
    assert isinstance(settings, BenchConfig), type(settings)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)
    label = model_label(resolved["model"])
    record: dict[str, Any] = {
        "kind": "bench",
        "status": "error",
        "reason": None,
        "overrides": job.overrides,
        "job_name": job.job_name,
        "sweep_dir": job.sweep_dir,
        "model": label,
        "precision": settings.trainer.precision,
        "compile_mode": settings.compile.mode,
        "batch_size": settings.bench.batch_size,
        "repeats": settings.bench.repeats,
    }
    tags = [
        "bench",
        f"model:{label}",
        f"precision:{settings.trainer.precision}",
        f"compile:{settings.compile.mode}",
        *settings.tags,
    ]
    tracker = Tracker(settings.logger, job, config=resolved, tags=tags)
    try:
        tracker.start()
        record.update(measure(settings, resolved))
        _log(tracker, record)
    except Exception as exc:  # W&B or logging trouble: still a row with its reason
        record.update(status="error", reason=f"{type(exc).__name__}: {exc}")
    finally:
        record.update(machine=machine_info(), wandb=tracker.info, config=resolved)
        write_job_json(Path(job.output_dir) / BENCH_FILE, record)
        failed = record["status"] == "error"
        tracker.finish("failed" if failed else "ok", error=record["reason"] if failed else None)
    return record


def task(cfg: DictConfig) -> float | None:
    """The Hydra task: one benchmark. Returns the speedup (for sweepers) or ``None``."""
    from kiln.experiments.train import JobFailed

    job = JobInfo.from_hydra()
    if cfg.get("print_config"):
        print(OmegaConf.to_yaml(cfg, resolve=True))
    record = run_bench_job(cfg, job)
    speedup = record.get("speedup")
    print(
        f"kiln-bench {record['model']} {record['precision']} compile={record['compile_mode']}: "
        f"{record['status']}"
        + (
            f", speedup {speedup:.3f} (95% CI {record['speedup_ci_low']:.3f}-"
            f"{record['speedup_ci_high']:.3f}{'' if record['significant'] else ', noise'})"
            if speedup
            else ""
        )
        + (f", compile {record['compile_time_s']:.1f}s" if record.get("compile_time_s") else "")
        + (f" ({record['reason']})" if record.get("reason") else "")
    )
    if record["status"] == "error" and job.sweep_dir is None:
        raise JobFailed(record["reason"])
    return speedup


def main() -> None:
    """Console script entry point."""
    from kiln.experiments.train import config_dir

    register_configs()
    hydra.main(version_base="1.3", config_path=config_dir(), config_name="bench")(task)()


if __name__ == "__main__":
    main()
