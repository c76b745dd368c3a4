"""One training job: open the W&B run, train in one or several processes, write summary.json.

The job never re-executes ``sys.argv``. With ``trainer.devices > 1`` it starts its worker
processes itself through ``kiln.core.launch``, handing each the resolved config as a plain
dict; each worker rebuilds the model and data from it and calls ``kiln.core.fit``. When the
processes already exist (``torchrun``, or SLURM with one task per device) the job *is* a
worker: it trains in-process, and only global rank 0 tracks and writes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import traceback
from pathlib import Path
from typing import Any

from kiln.experiments.job import JobInfo, machine_info, write_job_json
from kiln.experiments.tracking import LoggerConfig, Tracker

log = logging.getLogger(__name__)

SUMMARY_FILE = "summary.json"


def global_rank() -> int:
    """This process's global rank as the launcher set it (0 when there is one process)."""
    for var in ("RANK", "SLURM_PROCID"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


def build_module(resolved: dict[str, Any]) -> Any:
    """The LightningModule a resolved config describes: data module, then ``create_model``."""
    from hydra.utils import instantiate

    from kiln.models import OptimizerConfig, SchedulerConfig, create_model

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


def train_worker(resolved: dict[str, Any], loggers: list[Any]) -> dict[str, Any]:
    """Train as one process of the job; a top-level function so ``kiln.core.launch`` can pickle it.

    Args:
        resolved: The job's resolved config as plain containers.
        loggers: The job's Fabric loggers; only global rank 0 uses them.

    Returns:
        ``kiln.core.FitResult`` as a dict.
    """
    from kiln.core import CompileConfig, TrainerConfig, fit, weights_hash

    trainer = TrainerConfig(**resolved["trainer"])
    compile_cfg = CompileConfig(**resolved["compile"])
    seed_before_build(trainer.seed)  # same seed, same starting weights, on every rank and job
    module = build_module(resolved)
    init_hash = weights_hash(module)
    if global_rank() == 0:
        for logger in loggers:  # the W&B run's config (a worker process attaches to it)
            try:
                logger.log_hyperparams({"seed": trainer.seed, "init_weights_sha256": init_hash})
            except NotImplementedError:
                pass  # Fabric's CSVLogger keeps no hyperparameters; summary.json has them
    result = fit(
        module,
        trainer,
        compile_cfg,
        loggers=loggers if global_rank() == 0 else [],
        run_config=resolved,
    )
    return {**dataclasses.asdict(result), "init_weights_sha256": init_hash}


def _train(resolved: dict[str, Any], loggers: list[Any]) -> dict[str, Any]:
    from kiln.core import launch
    from kiln.core.launch import launched_externally

    trainer = resolved["trainer"]
    if launched_externally():  # torchrun or SLURM tasks: this process is already one rank
        return train_worker(resolved, loggers)
    if trainer["num_nodes"] > 1:
        raise ValueError(
            f"trainer.num_nodes={trainer['num_nodes']} needs processes on every node: start the "
            "job with torchrun or launcher=slurm (see packages/experiments/README.md)"
        )
    if trainer["devices"] > 1:
        return launch(train_worker, trainer["devices"], resolved, loggers)[0]
    return train_worker(resolved, loggers)


def _terminated(signum: int, frame: Any) -> None:
    raise SystemExit(f"terminated by signal {signum}")


def run_tags(resolved: dict[str, Any]) -> list[str]:
    """W&B tags: model, precision, compile mode, devices, plus the config's own tags."""
    model = resolved.get("model") or {}
    trainer = resolved["trainer"]
    return [
        f"model:{model.get('name', '?')}",
        *(["model:tiny"] if model.get("tiny") else []),  # debug=fast: the test-sized variant
        f"precision:{trainer['precision']}",
        f"compile:{resolved['compile']['mode']}",
        f"devices:{trainer['devices'] * trainer['num_nodes']}",
        *resolved.get("tags", []),
    ]


def _select(cfg: Any, key: str) -> Any:
    """``cfg.<key>`` resolved, or ``None`` when it is missing or does not resolve."""
    from omegaconf import OmegaConf

    try:
        value = OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)
    except Exception:  # noqa: BLE001 - a summary field is best effort, the error says why
        return None
    return OmegaConf.to_container(value, resolve=False) if OmegaConf.is_config(value) else value


def one_line_reason(exc: BaseException) -> str:
    """``"<Type>: <message>"`` on one line; a worker failure names the worker's own exception
    (the last line of its traceback) and its rank instead of carrying the whole traceback."""
    from kiln.core.launch import WorkerFailedError

    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if isinstance(exc, WorkerFailedError) and len(lines) > 1:
        return f"{lines[-1]} (in {lines[0].rstrip(':')})"
    return f"{type(exc).__name__}: {' '.join(lines)}"


def _progress(exc: BaseException) -> dict[str, Any]:
    """What a failed ``fit`` had completed (``global_step``, ``history``, ``train_loss``):
    ``kiln.core.fit`` attaches it to the exception it raises as ``kiln_result``."""
    result = getattr(exc, "kiln_result", None)
    if result is None:
        return {}
    found = {k: getattr(result, k, None) for k in ("global_step", "history", "train_loss")}
    return {k: v for k, v in found.items() if v is not None}


def run_job(cfg: Any, job: JobInfo) -> dict[str, Any]:
    """Run one training job and return its summary (also written to ``summary.json``).

    Any exception (a config that does not resolve or validate, NaN loss, bad shape, out of
    memory) is caught: the summary says ``status: failed`` with a one-line ``error``, the
    traceback goes to ``<job dir>/error.log``, and an open W&B run is finished as failed.
    Config errors fail before the W&B run is opened.
    """
    from omegaconf import OmegaConf

    from kiln.experiments.schema import validate

    summary: dict[str, Any] = {
        "kind": "train",
        "status": "failed",
        "error": None,
        "error_stage": None,
        "overrides": job.overrides,
        "job_name": job.job_name,
        "job_num": job.job_num,
        "run_name": job.run_name,
        "output_dir": job.output_dir,
        "sweep_dir": job.sweep_dir,
        "model": _select(cfg, "model.name"),
        "model_tiny": bool(_select(cfg, "model.tiny")),
        "precision": _select(cfg, "trainer.precision"),
        "compile_mode": _select(cfg, "compile.mode"),
        "devices": (_select(cfg, "trainer.devices") or 1)
        * (_select(cfg, "trainer.num_nodes") or 1),
        "accumulate_grad_batches": _select(cfg, "trainer.accumulate_grad_batches"),
        "seed": _select(cfg, "trainer.seed"),
        "init_weights_sha256": None,
        "metrics": {},
        "train_loss": None,
        "global_step": 0,
        "telemetry": {},
        "history": [],
        "checkpoint": None,
        "machine": machine_info(),
        "wandb": None,
        "config": None,
    }
    is_writer = global_rank() == 0
    tracker: Tracker | None = None
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminated)  # SLURM time limits, timeout(1), kill
    stage = "config"
    try:
        # Config errors (unresolvable interpolation, out-of-range value, unknown model)
        # fail here: before a W&B run is opened and before worker processes start.
        resolved: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
        summary["config"] = resolved
        validate(cfg)  # every __post_init__ range check, before any work
        if resolved.get("model"):
            from kiln.models import get_model_entry

            get_model_entry(resolved["model"]["name"])
        stage = "train"
        if is_writer:
            tracker = Tracker(
                LoggerConfig(**resolved["logger"]), job, config=resolved, tags=run_tags(resolved)
            ).start()
            summary["wandb"] = tracker.info
        result = _train(resolved, tracker.loggers if tracker else [])
        summary.update(
            status="ok",
            metrics=result["metrics"],
            train_loss=result["train_loss"],
            global_step=result["global_step"],
            telemetry=result["telemetry"],
            history=result["history"],
            checkpoint=result["checkpoint"],
            init_weights_sha256=result["init_weights_sha256"],
        )
    except BaseException as exc:  # noqa: BLE001 - a failed job must not stop the sweep
        summary.update(error=one_line_reason(exc), error_stage=stage, **_progress(exc))
        if is_writer:
            trace = Path(job.output_dir) / "error.log"
            trace.parent.mkdir(parents=True, exist_ok=True)
            trace.write_text(traceback.format_exc())
            summary["traceback_file"] = str(trace)
        log.debug("job %s failed:\n%s", job.run_name, traceback.format_exc())
        if not isinstance(exc, Exception):
            raise  # Ctrl-C, SIGTERM: recorded and finished below, then the process stops
    finally:
        if tracker is not None:
            tracker.summarize(
                {
                    **summary["metrics"],
                    "telemetry": summary["telemetry"],
                    "global_step": summary["global_step"],
                    "train_loss": summary["train_loss"],
                    "seed": summary["seed"],
                    "init_weights_sha256": summary["init_weights_sha256"],
                }
            )
            tracker.finish(summary["status"], summary["error"])
        if is_writer:
            write_job_json(Path(job.output_dir) / SUMMARY_FILE, summary)
    return summary
