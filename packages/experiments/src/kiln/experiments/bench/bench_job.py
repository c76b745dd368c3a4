"""One benchmark job: build the model, measure, log one W&B run, write ``bench.json``."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from kiln.experiments.bench.bench_config import BenchConfig, validate
from kiln.experiments.bench.fields import SUMMARY_KEYS
from kiln.experiments.jobs.compile_trace import compile_trace, log_trace
from kiln.experiments.jobs.lifecycle import Lifecycle
from kiln.experiments.settings.build import build_module, model_label
from kiln.experiments.settings.job_info import BENCH, JobInfo
from kiln.experiments.settings.suite_lists import is_suite_model
from kiln.experiments.tracking.summary import wandb_summary
from kiln.experiments.tracking.tags import run_tags
from kiln.experiments.tracking.tracker import Tracker, import_early


def measure(settings: BenchConfig, resolved: dict[str, Any]) -> dict[str, Any]:
    """Build the model and its fixed batch, then run the harness; never raises."""
    from kiln.experiments.bench.harness import run_benchmark

    described: dict[str, Any] = {}
    try:
        module = _build(settings, resolved)
        batch_size = settings.bench.batch_size or getattr(module, "default_batch_size", None)
        if batch_size is None:
            raise ValueError(
                f"bench.batch_size=null but model {model_label(resolved['model'])} has no "
                "batch size of its own (only model=bench/pt2 suite models do); set "
                "bench.batch_size=N"
            )
        described = {"batch_size": batch_size, **getattr(module, "describe", dict)()}
        batch = module.example_batch(batch_size)
    except Exception as exc:  # a model that cannot be built is a row, not a crashed sweep
        reason = f"build model: {type(exc).__name__}: {exc}"
        return {**described, "status": "error", "reason": reason}
    return described | run_benchmark(
        module,
        batch,
        precision=settings.trainer.precision,
        compile_cfg=settings.compile,
        accelerator=settings.trainer.accelerator,
        warmup=settings.bench.warmup,
        repeats=settings.bench.repeats,
        memory_steps=settings.bench.memory_steps,
        tolerance=settings.bench.tolerance,
        seed=settings.trainer.seed,
        cold_compile=settings.bench.cold_compile,
        profile_steps=settings.bench.profile_steps,
        profile_dir=settings.paths.output_dir,
    )


def _build(settings: BenchConfig, resolved: dict[str, Any]) -> Any:
    """The module to benchmark: a PyTorch suite model (``model=bench/pt2``) or a registered one."""
    if not is_suite_model(resolved["model"]):
        return build_module(settings)  # a BenchConfig has no data: one fixed batch
    from kiln.experiments.bench.harness import resolve_device
    from kiln.experiments.bench.suites import build_suite_module
    from kiln.models import OptimizerConfig, SchedulerConfig

    return build_suite_module(
        resolved["model"],
        resolve_device(settings.trainer.accelerator),
        OptimizerConfig(**resolved["optimizer"]),
        SchedulerConfig(**resolved["scheduler"]),
    )


def _log_pairs(tracker: Tracker | None, record: dict[str, Any]) -> None:
    """Per-pair step times as W&B history (one row per eager/compiled pair)."""
    pairs = zip(
        record.get("eager_times_s") or [], record.get("compiled_times_s") or [], strict=True
    )
    for i, (eager, compiled) in enumerate(pairs):
        for logger in tracker.loggers if tracker else []:
            logger.log_metrics(
                {
                    "bench/eager_step_s": eager,
                    "bench/compiled_step_s": compiled,
                    "bench/ratio": eager / compiled,
                },
                step=i,
            )


def _wandb_summary(record: dict[str, Any]) -> dict[str, Any]:
    blocks = {k: v for k, v in wandb_summary(record).items() if k not in SUMMARY_KEYS}
    return {**blocks, "bench": {k: record.get(k) for k in SUMMARY_KEYS}}


def run_bench_job(cfg: DictConfig, job: JobInfo) -> dict[str, Any]:
    """One benchmark job: measure, log to W&B, write ``bench.json``; returns the record.

    A config that does not validate raises before anything is written; anything later
    (W&B trouble included) is a record with status ``error`` and its reason.
    """
    settings = validate(cfg)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)
    label = model_label(resolved["model"])
    fields = {
        "model": label,
        "precision": settings.trainer.precision,
        "compile_mode": settings.compile.mode,
        "batch_size": settings.bench.batch_size,
        "suite": resolved["model"].get("suite") if is_suite_model(resolved["model"]) else None,
        "repeats": settings.bench.repeats,
        "config": resolved,
    }
    import_early(settings.logger)  # before the model's and Fabric's modules
    with Lifecycle(job, BENCH, fields, summarize=_wandb_summary) as life:
        tags = run_tags(
            label,
            settings.trainer.precision,
            settings.compile.mode,
            kind="bench",
            extra=settings.tags,
        )
        life.track(settings.logger, config=resolved, tags=tags)
        with life.measured(settings.trainer.accelerator, settings.trainer.precision):
            with compile_trace(settings.compile.trace, job.output_dir) as trace:
                life.record.update(measure(settings, resolved))
        _log_pairs(life.tracker, life.record)
        if trace:
            trace["wandb_artifact"] = log_trace(life.tracker, job.output_dir)
            life.record["compile_trace"] = trace
    return life.record
