"""One training job: validate the config, open the W&B run, train, write ``summary.json``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.experiments.jobs.compile_trace import compile_trace, log_trace
from kiln.experiments.jobs.lifecycle import Lifecycle, Requeued, Terminated
from kiln.experiments.jobs.stages import stage
from kiln.experiments.jobs.train_record import TrainRecord
from kiln.experiments.settings.job_info import STOPPED, TRAIN, JobInfo
from kiln.experiments.tracking.summary import wandb_summary
from kiln.experiments.tracking.tags import run_tags
from kiln.experiments.tracking.tracker import import_early
from kiln.experiments.train import checkpoint_state, data_identity, preflight, rerun
from kiln.experiments.train.worker import global_rank, in_process, train

if TYPE_CHECKING:
    from kiln.experiments.train.train_config import TrainConfig

SUMMARY_FILE = TRAIN.file


def fit_progress(exc: BaseException) -> dict[str, Any]:
    """What a failed ``fit`` had completed (:attr:`TrainRecord.PROGRESS`): ``kiln.core.fit``
    attaches it to the exception it raises as ``kiln_result``."""
    result = getattr(exc, "kiln_result", None)
    return {} if result is None else TrainRecord.progress(result)


def _wandb_summary(record: dict[str, Any]) -> dict[str, Any]:
    """The W&B run's summary: final metrics, every block of the record (telemetry, machine),
    and :attr:`TrainRecord.SUMMARY_SCALARS` (step, why it stopped, loss, seed, weights)."""
    return wandb_summary(record, TrainRecord.SUMMARY_SCALARS)


def keep_progress(earlier: dict[str, Any], failed: dict[str, Any]) -> dict[str, Any]:
    """The record of an attempt that failed after its W&B run opened: ``failed``, but where
    the job's ``earlier`` record got further (a resume that failed before its first step),
    the earlier figures (steps, rows, metrics, telemetry: what ``fit`` fills) stay: a record
    never holds less than it did; the status, error and attempts say what this one did."""
    if not isinstance(earlier.get("global_step"), int):
        return failed
    if earlier["global_step"] <= (failed.get("global_step") or 0):
        return failed
    return {**failed, **{k: earlier[k] for k in TrainRecord.fit_fields() if k in earlier}}


def _record(cfg: Any, job: JobInfo) -> dict[str, Any]:
    """The job's record before any work: who it is, and what its (maybe unresolvable)
    config says it trains."""
    return TrainRecord(**job.record(TRAIN), **TrainRecord.config_fields(cfg)).to_json()


def _requeued(exc: BaseException | None) -> bool:
    """Whether the attempt ended requeued: by kiln at a step boundary (``Requeued``), or by
    submitit's own handler, on a preemption signal that came before the loop (start-up)."""
    from kiln.experiments.launchers.slurm import requeued_by_submitit

    return isinstance(exc, Requeued) or requeued_by_submitit(exc)


def _attempt_end(exc: BaseException | None, record: dict[str, Any]) -> str:
    """How an attempt ended, for ``attempts.json`` (``killed`` is written by the next one)."""
    if _requeued(exc):
        return "requeued"
    if isinstance(exc, Terminated):
        return exc.signal_name
    if isinstance(exc, KeyboardInterrupt):
        return "SIGINT"
    return "ok" if exc is None and record["status"] == "ok" else "failed"


def end_after_signal(signal_name: str, record: dict[str, Any]) -> None:
    """Act on the signal that stopped ``fit`` at a step boundary, now that its checkpoint is
    written: SIGTERM exits 143 (``Terminated``), SIGINT raises ``KeyboardInterrupt``,
    SIGUSR2 under submitit, or a SIGTERM of SLURM's preemption, raises ``Requeued``
    (``run_job`` requeues once ``record`` and the W&B run are finished). A preemption that
    ``hydra.launcher.preempt_requeue`` does not requeue (a ``PreemptMode=CANCEL`` partition)
    stops the job as SIGTERM does; ``record["preemption"]`` says which it was and why."""
    import signal

    from kiln.experiments.launchers.slurm import preemption

    signum = signal.Signals[signal_name]
    if not callable(signal.getsignal(signum)):
        raise Terminated(signum)  # the default action would end the process unrecorded
    if signum in (signal.SIGUSR2, signal.SIGTERM):
        preempting = preemption()
        if preempting:
            record["preemption"] = preempting
            if not preempting["requeued"]:
                raise Terminated(signum)  # stopped: a re-run of the sweep resumes it
        if signum == signal.SIGUSR2 or preempting:
            raise Requeued(record, signal_name)  # a preemption SIGTERM requeues as USR2 does
    signal.raise_signal(signum)  # the Python handler runs (and raises) before this returns


def _stopped_at_a_step(exc: BaseException | None, record: dict[str, Any]) -> bool:
    """Whether SIGTERM or Ctrl-C stopped ``fit`` at a step boundary, with a checkpoint there
    (``end_after_signal``): the job is ``stopped``, not failed; a re-run resumes it."""
    return isinstance(exc, Terminated | KeyboardInterrupt) and record.get("stop_reason") == "signal"


def _requeue(job: JobInfo, requeued: Requeued) -> dict[str, Any]:
    """Hand a job that USR2 stopped (its record written, its W&B run finished) to submitit's
    handler, which requeues it and exits (rank 0) or returns (other ranks)."""
    import signal

    from kiln.core.distributed.stop import hand_over
    from kiln.experiments.jobs.lifecycle import one_line_reason
    from kiln.experiments.settings.job_files import relocatable, write_job_json

    # a requeue makes SLURM send SIGTERM to the job at once: nothing is left to record
    signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        hand_over(signal.SIGUSR2)
    except Exception as exc:  # not requeued: scontrol refused, "timed-out too many times"
        reason = f"stopped by {requeued.signal_name} with a checkpoint, not requeued: "
        requeued.record.update(status="failed", error=reason + one_line_reason(exc))
        if global_rank() == 0:
            attempts = requeued.record.get("attempts")
            if attempts:  # its end was written as requeued before the requeue was tried
                step = TrainRecord.from_json(requeued.record).global_step
                rerun.end_attempt(
                    job.output_dir, attempts, "failed", step, error=requeued.record["error"]
                )
            record = relocatable(requeued.record, job.output_dir)
            write_job_json(Path(job.output_dir) / TRAIN.file, record)
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
    return rerun.finished_record(job.output_dir, resolved)  # type: ignore[arg-type]


def _repair_run(record: dict[str, Any], job: JobInfo) -> None:
    """Make the W&B run of a job that ended ``ok`` equal to its record: a job killed between
    writing its ``summary.json`` and its run's end (or whose end W&B's service did not live
    to write) left a run without an exit record, and without the rows its W&B process had
    not written yet. The run is resumed, gets exactly the record's rows it lacks (by kind
    and step), the record's summary and an ``ok`` end. Writer only; a run whose last
    attempt ended it (``wandb_finished``) is equal already."""
    from kiln.experiments.jobs.lifecycle import one_line_reason
    from kiln.experiments.settings import job_files
    from kiln.experiments.settings.base import LoggerConfig
    from kiln.experiments.tracking.tracker import FINISHED_FILE, STEP_METRIC, Tracker
    from kiln.experiments.tracking.wandb_files import (
        has_exit,
        logged_rows,
        record_row_key,
        run_files,
    )

    run_id = (record.get("wandb") or {}).get("run_id")
    directory = Path(job.output_dir)
    if global_rank() != 0 or not run_id:
        return
    marker = directory / FINISHED_FILE
    if marker.is_file() and marker.read_text().strip() == run_id:
        return
    rows = rerun.history_rows(record)
    try:
        files = run_files(directory, run_id)
        held = logged_rows(files, STEP_METRIC)
        ended = has_exit(files)
        cfg = LoggerConfig(**((record.get("config") or {}).get("logger") or {}))
    except Exception:  # a run file wandb cannot read: a resume would log blind
        return
    if not files:  # no run files left (deleted): nothing to repair
        return
    lacking = [row for row in rows if record_row_key(row) not in held]
    if ended and not lacking:  # ended by a kiln without the marker
        job_files.write(marker, run_id + "\n")
        return
    tracker = Tracker(cfg, job, config=record.get("config"), resume=True)
    try:
        tracker.start()
        logged = tracker.log_missing(rows)
        tracker.summarize(_wandb_summary(record))
        tracker.finish("ok")
    except Exception as error:  # the record stands; the next re-run tries again
        print(f"{job.output_dir}: its W&B run lacks rows or its end, and could not be "
              f"repaired now ({one_line_reason(error)}): a later re-run tries again",
              flush=True)  # fmt: skip
        return
    print(f"{job.output_dir}: its W&B run had no end (the job was killed after writing its "
          f"record) or lacked rows of it: logged the {logged} missing row(s) and finished it "
          "now", flush=True)  # fmt: skip


def _missing_note(record: dict[str, Any]) -> str | None:
    """:func:`rerun.missing_note` for a finished job's record (its checkpoint directory)."""
    directory = ((record.get("config") or {}).get("trainer") or {}).get("checkpoint_dir")
    from kiln.core.checkpoints.lookup import missing_checkpoints

    try:
        if directory is None or not missing_checkpoints(directory):
            return None
    except Exception:  # a run.json that cannot be read: a resume names it
        return None
    found = rerun.latest_checkpoint_meta(directory)
    return rerun.missing_note(directory, found[0] if found else None)


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
    the next step boundary with a checkpoint (``kiln.core.distributed.stop``): SIGTERM and SIGINT
    leave ``status: stopped`` (``stop_signal`` names the signal); USR2 requeues the job
    through submitit (``status: requeued``, its attempt ``requeued``). A finished job re-run
    with fewer ``trainer.max_steps`` than it has is refused in the config stage; one re-run
    with as many (and a change resume allows) trains nothing and keeps its record (its
    attempt ``skipped``).
    """
    from contextlib import nullcontext

    from kiln.experiments.jobs.lock import JobDirBusyError, job_dir_lock

    try:  # the job's one writer holds its directory (released by the OS however it ends)
        with job_dir_lock(job.output_dir) if global_rank() == 0 else nullcontext():
            try:
                record = _run_job(cfg, job)
            except Requeued as requeued:
                return _requeue(job, requeued)
    except JobDirBusyError as busy:  # the directory is another process's: write nothing there
        record = {**_record(cfg, job), "error": str(busy), "error_stage": "config"}
    if record.get("status") == TRAIN.failed_status and global_rank() == 0:
        _note_refused(job, record)
    return record


def _note_refused(job: JobInfo, record: dict[str, Any]) -> None:
    """A job refused in an earlier job's directory, which keeps its record: a single run says
    so in one line; a sweep's job leaves a note the end-of-sweep check names and exits
    non-zero on (``SweepStatus``)."""
    from kiln.experiments.settings import job_files

    if job_files.state(job.output_dir) == "owned":
        return  # the job's own record says it failed
    if job.sweep_dir is None:  # it exits non-zero; the line a user can copy, unwrapped
        print(f"{job.output_dir}: refused, its record stays as it was: {record.get('error')}",
              file=sys.stderr, flush=True)  # fmt: skip
        return
    name = str(Path(job.output_dir).resolve().relative_to(Path(job.sweep_dir).resolve()))
    job_files.note_refusal(job.sweep_dir, name.replace("/", "_"), record.get("error"))


def _checked_config(
    cfg: Any, job: JobInfo, life: Lifecycle, attempts: list[dict[str, Any]]
) -> tuple[TrainConfig, dict[str, Any], Path | None, int]:
    """The job's config stage: resolve and validate ``cfg`` into ``life.record`` and check
    what it names (plugins, checkpoint dir, resume, accelerator, model). Config errors (an
    unresolvable interpolation, an out-of-range value, an unknown model, a checkpoint or
    directory the job cannot resume from) fail here: before a W&B run is opened and before
    worker processes start.

    Returns:
        The validated config, the resolved one, the checkpoint the job resumes from and its
        step (``None, 0``: a fresh start).
    """
    from omegaconf import OmegaConf

    from kiln.core.checkpoints.rundir import check_writable
    from kiln.core.distributed.threads import apply_threads_per_rank
    from kiln.experiments.train.train_config import validate

    if OmegaConf.select(cfg, "trainer.checkpoint_dir") is None:
        rerun.check_resume_without_dir(OmegaConf.select(cfg, "trainer.resume"))
        cfg.trainer.resume = None  # checkpoint_dir=null turns checkpoints off
    resolved: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    life.record["config"] = resolved
    settings = validate(cfg)  # every __post_init__ range check, before any work
    life.record.update(TrainRecord.config_fields(settings))
    # before the model is built and calibrated: the count every rank computes with
    life.record["machine"]["threads_per_rank"] = apply_threads_per_rank(settings.trainer)
    if life.writer:
        import_early(settings.logger)  # before the model's and Fabric's modules
    from kiln.models.plugins import load_plugins

    load_plugins(settings.plugins)
    trainer = settings.trainer
    if trainer.checkpoint_dir is not None:
        check_writable(trainer.checkpoint_dir)
    from_step, checkpoint = rerun.check_resume(resolved)
    if attempts:  # written now: a SIGKILLed attempt leaves no end to say it
        rerun.set_from_step(job.output_dir, attempts, from_step)
    rerun.check_steps_left(from_step, checkpoint, trainer.max_steps)
    rerun.check_claim(resolved, checkpoint)
    preflight.check_machine(settings)
    preflight.warn_about_schedule(settings)
    return settings, resolved, checkpoint, from_step


def _finished_at(life: Lifecycle, settings: TrainConfig, from_step: int) -> dict[str, Any] | None:
    """The record of a job that already ended ``ok`` at the step it would resume from, when
    that is ``trainer.max_steps`` (re-run with a change resume allows, e.g. logging): there
    is nothing to train, and an attempt that trains nothing changes no figure of the job."""
    if from_step == 0 or from_step != settings.trainer.max_steps:
        return None
    earlier = life.earlier_record()
    if earlier is None or earlier.get("status") != "ok" or earlier.get("global_step") != from_step:
        return None  # a job killed after its last checkpoint: the attempt completes its record
    return earlier


def _record_attempt(
    life: Lifecycle, job: JobInfo, attempts: list[dict[str, Any]], exc: BaseException | None
) -> None:
    """The job's status once its work ended (``exc``), and how this attempt ended, into
    ``attempts.json`` and the record (``Lifecycle``'s ``on_exit``)."""
    if isinstance(exc, Requeued):
        life.record["status"] = "requeued"  # the next attempt resumes it
    elif _requeued(exc):  # submitit requeued it while it started: nothing trained
        reason = f"requeued by submitit while the job started ({life.record.get('error_stage')})"
        life.record.update(status="requeued", error=reason)
    elif _stopped_at_a_step(exc, life.record):
        life.record.update(status=STOPPED, error=None)  # a re-run resumes it
    if not attempts:
        return
    end, details = _attempt_end(exc, life.record), {}
    if life.unchanged:
        end = "skipped"  # nothing to train: see _finished_at
    step = TrainRecord.from_json(life.record).global_step
    if end == "failed" and life.refused:  # nothing trained: the record stays
        end = "refused"
        details = {k: life.record[k] for k in ("error", "error_stage")}
        if life.kept is not None:  # the job still stands where its last attempt left it
            step = TrainRecord.from_json(life.kept).global_step
    elif end == "failed":  # kept once a later attempt ends ok (a lost node's name)
        details = {"error": life.record.get("error")}
    if life.record.get("preemption"):  # this attempt's: a later one's record drops it
        details["preemption"] = life.record["preemption"]
    rerun.end_attempt(job.output_dir, attempts, end, step, **details)
    life.record["attempts"] = attempts


def _add_of_measured_peak(record: dict[str, Any]) -> None:
    """Put the achieved FLOP/s over the matmul peak this job measured on its device
    (``jobs.mfu``) into the record's ``telemetry`` beside ``mfu``: a figure on the CPU too,
    where ``mfu`` has no datasheet peak to divide by."""
    from kiln.experiments.jobs.mfu import mfu_fields

    fraction = mfu_fields(TrainRecord.from_json(record))["of_measured_peak"]
    if fraction is not None and isinstance(record.get("telemetry"), dict):
        record["telemetry"]["of_measured_peak"] = fraction


def _run_job(cfg: Any, job: JobInfo) -> dict[str, Any]:
    """``run_job`` without the requeue."""
    done = _already_done(cfg, job)  # every rank alike: one may not train alone
    if done is not None:
        print(f"{job.output_dir}: already ended ok with this config, skipped", flush=True)
        _repair_run(done, job)
        note = _missing_note(done)
        if note is not None:  # the record stands; what a later resume would start from
            print(
                f"{job.output_dir}: {note}; the record stays as it is (raise "
                "trainer.max_steps to train on from there)",
                flush=True,
            )
        return done
    attempts: list[dict[str, Any]] = []

    def record_attempt(exc: BaseException | None) -> None:
        _record_attempt(life, job, attempts, exc)

    with Lifecycle(
        job,
        TRAIN,
        _record(cfg, job),
        writer=global_rank() == 0,
        summarize=_wandb_summary,
        progress=fit_progress,
        on_exit=record_attempt,
        keep_progress=keep_progress,
    ) as life:
        if life.writer:  # first: a refused attempt is listed too
            attempts.extend(rerun.begin_attempt(job.output_dir))
        with stage("config"):
            settings, resolved, checkpoint, from_step = _checked_config(cfg, job, life, attempts)
            trainer = settings.trainer
            finished = _finished_at(life, settings, from_step)
        if finished is not None:
            print(
                f"{job.output_dir}: already trained to trainer.max_steps={from_step} and ended "
                "ok: nothing to train, its record and W&B run stay as they are (raise "
                "trainer.max_steps to train on)",
                flush=True,
            )
            life.keep(finished)
            return life.record
        with stage("setup"):
            # the data and model the config describes (a CSV without its label column, labels
            # the model has no class for, too few rows for a batch): before W&B, too
            module = preflight.build_checked(settings)
            # the data the checkpoint was trained on, against the data now
            data_identity.check(module, checkpoint, job.output_dir, attempts)
            # the callbacks' state the checkpoint holds, against the callbacks now
            checkpoint_state.check(settings, checkpoint, job.output_dir, attempts)
            if not in_process(trainer):
                module = None  # the workers build their own
        with stage("train"):
            _train(life, job, settings, resolved, checkpoint, module)
    return life.record


def _train(
    life: Lifecycle,
    job: JobInfo,
    settings: TrainConfig,
    resolved: dict[str, Any],
    checkpoint: Any,
    module: Any,
) -> None:
    """The train stage: the W&B run (resumed, backfilled), the fit (traced with
    ``compile.trace``), and its results into the record."""
    trainer = settings.trainer
    record = TrainRecord.from_json(life.record)
    tags = run_tags(
        record.model or "?",
        trainer.precision,
        settings.compile.mode,
        tiny=record.model_tiny,
        devices=record.devices,
        extra=settings.tags,
    )
    life.track(settings.logger, config=resolved, tags=tags, resume=True)
    if life.tracker is not None and checkpoint is not None:
        rerun.backfill(life.tracker, checkpoint)
    with life.measured(trainer.accelerator, trainer.precision):
        with compile_trace(settings.compile.trace, job.output_dir) as trace:
            result = train(settings, resolved, life.loggers, module)
    if trace:
        trace["wandb_artifact"] = log_trace(life.tracker, job.output_dir)
        life.record["compile_trace"] = trace
    life.record.update(TrainRecord.fit_values(result))
    if life.record["checkpoint"] is None and checkpoint is not None:
        # no step was left (stopped at its last step): its newest is the one it resumed from
        life.record["checkpoint"] = str(checkpoint)
    _add_of_measured_peak(life.record)
    profile = result.get("profile")
    if profile and life.tracker is not None and life.tracker.run is not None:
        name = f"profile-{life.tracker.run.id}"
        life.tracker.log_folder(Path(profile["trace"]).parent, name, "profile")
        profile["wandb_artifact"] = name
    if result.get("stop_reason") == "signal":
        end_after_signal(result["stop_signal"], life.record)
    else:
        life.record["status"] = "ok"
