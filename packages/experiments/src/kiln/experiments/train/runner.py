"""One training job: validate the config, open the W&B run, train, write ``summary.json``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.experiments.job import TRAIN, JobInfo
from kiln.experiments.lifecycle import Lifecycle, Requeued, Terminated
from kiln.experiments.schema import LoggerConfig
from kiln.experiments.stages import stage
from kiln.experiments.tracking.summary import wandb_summary
from kiln.experiments.tracking.tags import run_tags
from kiln.experiments.train import preflight
from kiln.experiments.train import resume as job_resume
from kiln.experiments.train.worker import global_rank, in_process, train

SUMMARY_FILE = TRAIN.file


def _select(cfg: Any, key: str) -> Any:
    """``cfg.<key>`` resolved, or ``None`` when it is missing or does not resolve."""
    from omegaconf import OmegaConf

    try:
        value = OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)
    except Exception:
        return None
    return OmegaConf.to_container(value, resolve=False) if OmegaConf.is_config(value) else value


def fit_progress(exc: BaseException) -> dict[str, Any]:
    """What a failed ``fit`` had completed (``global_step``, ``history``, ``train_loss``):
    ``kiln.core.fit`` attaches it to the exception it raises as ``kiln_result``."""
    result = getattr(exc, "kiln_result", None)
    if result is None:
        return {}
    found = {k: getattr(result, k, None) for k in ("global_step", "history", "train_loss")}
    return {k: v for k, v in found.items() if v is not None}


def _wandb_summary(record: dict[str, Any]) -> dict[str, Any]:
    """The W&B run's summary: final metrics, every block of the record (telemetry, machine),
    step, why it stopped, loss, seed, initial weights."""
    scalars = ("global_step", "stop_reason", "stop_signal", "train_loss", "seed")
    return wandb_summary(record, (*scalars, "init_weights_sha256"))


def _fields(cfg: Any) -> dict[str, Any]:
    """The train record's own fields, read from the (maybe unresolvable) config."""
    return {
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
        # why training stopped (FitResult.stop_reason; with "signal", the signal's name)
        "stop_reason": None,
        "stop_signal": None,
        "telemetry": {},
        "history": [],
        "checkpoint": None,
    }


def _attempt_end(exc: BaseException | None, record: dict[str, Any]) -> str:
    """How an attempt ended, for ``attempts.json`` (``killed`` is written by the next one)."""
    if isinstance(exc, Requeued):
        return "requeued"
    if isinstance(exc, Terminated):
        return exc.signal_name
    if isinstance(exc, KeyboardInterrupt):
        return "SIGINT"
    return "ok" if exc is None and record["status"] == "ok" else "failed"


def end_after_signal(signal_name: str, record: dict[str, Any]) -> None:
    """Act on the signal that stopped ``fit`` at a step boundary, now that its checkpoint is
    written: SIGTERM exits 143 (``Terminated``), SIGINT raises ``KeyboardInterrupt``,
    SIGUSR2 under submitit raises ``Requeued`` (``run_job`` requeues once ``record`` and
    the W&B run are finished)."""
    import signal

    signum = signal.Signals[signal_name]
    if not callable(signal.getsignal(signum)):
        raise Terminated(signum)  # the default action would end the process unrecorded
    if signum == signal.SIGUSR2:
        raise Requeued(record)
    signal.raise_signal(signum)  # the Python handler runs (and raises) before this returns


def _requeue(job: JobInfo, requeued: Requeued) -> dict[str, Any]:
    """Hand a job that USR2 stopped (its record written, its W&B run finished) to submitit's
    handler, which requeues it and exits (rank 0) or returns (other ranks)."""
    import signal

    from kiln.experiments.job import write_job_json
    from kiln.experiments.lifecycle import one_line_reason

    # a requeue makes SLURM send SIGTERM to the job at once: nothing is left to record
    signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        signal.raise_signal(signal.SIGUSR2)
    except Exception as exc:  # not requeued (submitit: "timed-out too many times")
        requeued.record.update(status="failed", error=one_line_reason(exc))
        if global_rank() == 0:
            write_job_json(Path(job.output_dir) / TRAIN.file, requeued.record)
        raise
    return requeued.record


def _already_done(cfg: Any, job: JobInfo) -> dict[str, Any] | None:
    """The job's record when an earlier run of it into this directory ended ``ok`` with the
    same config (a re-run sweep skips it)."""
    from omegaconf import OmegaConf

    try:
        resolved = OmegaConf.to_container(cfg, resolve=True)
    except Exception:
        return None
    return job_resume.finished_record(job.output_dir, resolved)  # type: ignore[arg-type]


def run_job(cfg: Any, job: JobInfo) -> dict[str, Any]:
    """Run one training job and return its summary (also written to ``summary.json``).

    Any exception (a config that does not resolve or validate, NaN loss, bad shape, out of
    memory) is caught: the summary says ``status: failed`` with a one-line ``error``, the
    traceback goes to ``<job dir>/error.log``, and an open W&B run is finished as failed.
    Config errors fail before the W&B run is opened.

    A job re-run into its directory resumes from its newest checkpoint (``trainer.resume``
    is ``auto``; the config may not change what the checkpoint was trained with) and its
    W&B run; one that already ended ``ok`` with the same config is skipped. Each attempt is
    listed in the record's ``attempts``. SIGTERM, SIGINT and SLURM's USR2 stop training at
    the next step boundary with a checkpoint (``kiln.core.stop``); USR2 then requeues the
    job through submitit (its attempt ``requeued``).
    """
    from contextlib import nullcontext

    from kiln.experiments.joblock import JobDirBusyError, job_dir_lock

    try:  # the job's one writer holds its directory (released by the OS however it ends)
        with job_dir_lock(job.output_dir) if global_rank() == 0 else nullcontext():
            try:
                return _run_job(cfg, job)
            except Requeued as requeued:
                return _requeue(job, requeued)
    except JobDirBusyError as busy:  # the directory is another process's: write nothing there
        return {**job.record(TRAIN), **_fields(cfg), "error": str(busy), "error_stage": "config"}


def _run_job(cfg: Any, job: JobInfo) -> dict[str, Any]:
    """``run_job`` without the requeue."""
    from omegaconf import OmegaConf

    from kiln.core.rundir import check_writable
    from kiln.experiments.train.schema import validate

    done = _already_done(cfg, job)  # every rank alike: one may not train alone
    if done is not None:
        print(f"{job.output_dir}: already ended ok with this config, skipped", flush=True)
        return done
    attempts: list[dict[str, Any]] = []

    def record_attempt(exc: BaseException | None) -> None:
        if isinstance(exc, Requeued):
            life.record["status"] = "requeued"  # the next attempt resumes it
        if attempts:
            end, details = _attempt_end(exc, life.record), {}
            if end == "failed" and life.refused:  # nothing trained: the record stays
                end = "refused"
                details = {k: life.record[k] for k in ("error", "error_stage")}
            elif end == "failed":  # kept once a later attempt ends ok (a lost node's name)
                details = {"error": life.record.get("error")}
            step = life.record["global_step"]
            job_resume.end_attempt(job.output_dir, attempts, end, step, **details)
            life.record["attempts"] = attempts

    with Lifecycle(
        job,
        TRAIN,
        _fields(cfg),
        writer=global_rank() == 0,
        summarize=_wandb_summary,
        progress=fit_progress,
        on_exit=record_attempt,
    ) as life:
        if life.writer:  # first: a refused attempt is listed too
            attempts.extend(job_resume.begin_attempt(job.output_dir))
        with stage("config"):
            # Config errors (unresolvable interpolation, out-of-range value, unknown model,
            # a checkpoint or directory the job cannot resume from) fail here: before a W&B
            # run is opened and before worker processes start.
            if OmegaConf.select(cfg, "trainer.checkpoint_dir") is None:
                cfg.trainer.resume = None  # checkpoint_dir=null turns checkpoints off
            resolved: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
            life.record["config"] = resolved
            validate(cfg)  # every __post_init__ range check, before any work
            from kiln.models.plugins import load_plugins

            load_plugins(resolved.get("plugins") or [])
            trainer = resolved["trainer"]
            if trainer["checkpoint_dir"] is not None:
                check_writable(trainer["checkpoint_dir"])
            from_step, checkpoint = job_resume.check_resume(resolved)
            if attempts:  # written now: a SIGKILLed attempt leaves no end to say it
                job_resume.set_from_step(job.output_dir, attempts, from_step)
            job_resume.check_claim(resolved, checkpoint)
            preflight.check_accelerator(trainer["accelerator"])
            if resolved.get("model"):
                from kiln.models import get_model_entry

                get_model_entry(resolved["model"]["name"])
        with stage("setup"):
            # the data and model the config describes (a CSV without its label column, labels
            # the model has no class for, too few rows for a batch): before W&B, too
            module = preflight.build_checked(resolved)
            if not in_process(trainer):
                module = None  # the workers build their own
        with stage("train"):
            model = resolved.get("model") or {}
            tags = run_tags(
                model.get("name", "?"),
                trainer["precision"],
                resolved["compile"]["mode"],
                tiny=bool(model.get("tiny")),
                devices=trainer["devices"] * trainer["num_nodes"],
                extra=resolved.get("tags", []),
            )
            life.track(LoggerConfig(**resolved["logger"]), config=resolved, tags=tags, resume=True)
            if life.tracker is not None and checkpoint is not None:
                job_resume.backfill(life.loggers, checkpoint, life.tracker.logged_through)
            with life.measured(trainer["accelerator"], trainer["precision"]):
                result = train(resolved, life.loggers, module)
            life.record.update(
                **{
                    k: result[k]
                    for k in (
                        "metrics",
                        "train_loss",
                        "global_step",
                        "telemetry",
                        "history",
                        "checkpoint",
                        "init_weights_sha256",
                        "stop_reason",
                        "stop_signal",
                    )
                },
            )
            if result.get("stop_reason") == "signal":
                end_after_signal(result["stop_signal"], life.record)
            else:
                life.record["status"] = "ok"
    return life.record
