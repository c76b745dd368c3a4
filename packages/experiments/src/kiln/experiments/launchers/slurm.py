"""kiln's SLURM jobs (``launcher=slurm``): a preemption at any moment of a job's life
requeues it once, and the submitter never waits on a job that SLURM has ended or forgotten.

Job side. A preemption reaches a task as USR2 (``scancel --signal=USR2``, ``--full``, the
time-limit warning of ``--signal``, passed on by the batch shell: :mod:`kiln.experiments.
slurm_batch`) or as SLURM's own SIGTERM (``PreemptMode=REQUEUE``: SIGTERM to the tasks, a
``GraceTime``, then SIGKILL and a requeue; a job that ended within the grace time is not
requeued). submitit installs its USR2 handler (checkpoint and requeue) only once it has
loaded the job's pickle, seconds after the process started, so SLURM runs
:func:`start_job` in place of submitit's own entry (``python -u -m kiln.experiments.launchers.slurm
-u -m submitit.core._submit <folder>``): its first act defers USR2 and TERM, it adds a
USR2 the batch shell kept for this attempt, and the job replays them once submitit's
handler is in place (:func:`replay_deferred_signal`). Later, kiln's loop stops at a step
boundary with a checkpoint (``kiln.core.distributed.stop``); a SIGTERM is a preemption when SLURM
says so (:func:`preemption`), and then requeues the job as USR2 does. A repeat of the signal
(``--full`` reaches a task directly and through the shell) never requeues a second time
(:func:`guard_requeue`).

Submitter side. submitit learns that a job ended from its result file or from ``sacct``.
Where accounting is off (``AccountingStorageType=accounting_storage/none``, as on the local
test cluster) ``sacct`` fails on every poll and a job that died without a result (killed at
start-up, OOM-killed, ``scancel``) read ``UNKNOWN`` forever. :func:`wait_for_results` asks
``squeue`` instead of ``sacct`` there (saying so once): a job that SLURM reports ended (or
does not know) and that left no result within :data:`LOST_GRACE_S` fails the sweep with
:class:`SlurmJobLost`, naming the job, its state and its log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

LOST_GRACE_S = 30.0
"""How long a job that SLURM reports ended may take to leave its result file (on a shared
filesystem it can show up late)."""
POLL_S = 5.0
"""How often the submitter looks at its jobs' result files and asks ``squeue``."""

# states a job never leaves (PREEMPTED is not one: a requeued job goes back to PENDING)
ENDED_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "TIMEOUT",
    }
)

_deferred: list[int] = []  # preemption signals that arrived before submitit's handler
_requeue_started = [False]  # submitit's requeue handler ran in this process


class SlurmJobLost(RuntimeError):
    """SLURM has ended or forgotten a job of the sweep, and the job left no result."""


def preemption_signal() -> signal.Signals:
    """The signal submitit requeues on (``SUBMITIT_PREEMPT_SIGNAL``, default USR2)."""
    name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
    return signal.Signals["SIG" + name]


def _defer(signum: int, frame: Any) -> None:
    if signum not in _deferred:
        _deferred.append(signum)
    # os.write: print() may be the very call this handler interrupted
    note = f"kiln: {signal.Signals(signum).name} while the job starts: acted on once started\n"
    os.write(sys.stderr.fileno(), note.encode())


def start_job(argv: Sequence[str]) -> None:
    """Run a submitit job (``argv``: submitit's ``-u -m submitit.core._submit <folder>``),
    the preemption signal and SIGTERM deferred until submitit's own handler is in place."""
    for signum in (preemption_signal(), signal.SIGTERM):  # first: the imports take seconds
        signal.signal(signum, _defer)
    from kiln.experiments.launchers.slurm_batch import kept_signals

    # after the handler: a signal the batch shell kept is in the file or arrives from now on
    for name in kept_signals():
        if signal.Signals["SIG" + name] == preemption_signal():
            _defer(preemption_signal(), None)
    if not argv:
        raise SystemExit("usage: python -m kiln.experiments.launchers.slurm ... <submitit folder>")
    from submitit.core.submission import process_job

    process_job(argv[-1])


def replay_deferred_signal() -> None:
    """In the job, once submitit has installed its handlers: act on a signal that arrived
    before. USR2, or a SIGTERM of a preemption, requeues the job (submitit requeues and
    exits, on rank 0); another SIGTERM ends the process as SIGTERM does."""
    deferred = list(_deferred)
    _deferred.clear()
    if preemption_signal() in deferred or (signal.SIGTERM in deferred and requeue_on_preemption()):
        signal.raise_signal(preemption_signal())  # the Python handler runs before this returns
        # a rank other than 0 returns here: rank 0 requeues the job, and this task has no part
        raise SystemExit(0)
    if signal.SIGTERM in deferred:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)


PREEMPT_REQUEUE = ("auto", "true", "false")
"""The values of ``hydra.launcher.preempt_requeue`` (see :func:`preemption`)."""
_preempt_requeue = ["auto"]  # this job's hydra.launcher.preempt_requeue


def check_preempt_requeue(value: Any) -> str:
    """``hydra.launcher.preempt_requeue`` as one of :data:`PREEMPT_REQUEUE` (a YAML boolean
    reads as ``true`` or ``false``), or a one-line error naming the key and what is valid."""
    text = str(value).lower()
    if text not in PREEMPT_REQUEUE:
        raise ValueError(
            f"hydra.launcher.preempt_requeue={value!r} is not valid: auto (requeue a preempted "
            "job unless its partition's PreemptMode is CANCEL), true (always) or false (never)"
        )
    return text


def set_preempt_requeue(value: Any) -> None:
    """In the job: follow ``hydra.launcher.preempt_requeue=value`` when SLURM preempts it."""
    _preempt_requeue[0] = check_preempt_requeue(value)


def scontrol_fields(out: str) -> dict[str, str]:
    """One record of ``scontrol show <what> --oneliner`` as ``{field: value}``."""
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def _scontrol_fields(*what: str) -> dict[str, str]:
    """``scontrol show <what> --oneliner`` as ``{field: value}``; ``{}`` without an answer."""
    try:
        out = subprocess.run(
            ["scontrol", "show", *what, "--oneliner"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return scontrol_fields(out)


def preemption() -> dict[str, Any]:
    """What SLURM's preemption of this job is and what kiln does about it, or ``{}`` when
    SLURM is not preempting it (:func:`preemption_of` this job's ``scontrol`` record and its
    partition's).

    Asked on rank 0 of a submitit SLURM job only (the rank that requeues): ``{}`` elsewhere,
    and when ``scontrol`` gives no answer.
    """
    job_id = os.environ.get("SLURM_JOB_ID")
    if os.environ.get("SUBMITIT_EXECUTOR") != "slurm" or not job_id:
        return {}
    if os.environ.get("SLURM_PROCID", "0") != "0":
        return {}
    job = _scontrol_fields("job", job_id)
    return preemption_of(job, lambda name: _scontrol_fields("partition", name), _preempt_requeue[0])


def preemption_of(
    job: dict[str, str], partition: Callable[[str], dict[str, str]], setting: str
) -> dict[str, Any]:
    """What SLURM's preemption of the job whose ``scontrol show job`` record is ``job`` is,
    and what kiln does about it; ``{}`` when SLURM is not preempting it (preempted: still
    ``RUNNING`` with a ``PreemptTime``; a SIGTERM of ``scancel``, a time limit or SLURM's own
    requeue is not). ``partition(name)`` gives a partition's ``scontrol`` record.

    ``{"partition", "preempt_mode", "preempt_requeue", "requeued"}``: ``requeued`` says
    whether kiln requeues the job once it is checkpointed. ``setting``
    (``hydra.launcher.preempt_requeue``) decides: ``true`` always, ``false`` never (the job
    stops; a re-run of the sweep resumes it), ``auto`` (the default) as the partition's
    ``PreemptMode`` says: not where it is ``CANCEL`` (the site ends preempted jobs), else yes
    (``REQUEUE``; SLURM itself does not requeue a job that ended within its grace time, so
    kiln does).
    """
    if job.get("JobState") != "RUNNING" or job.get("PreemptTime", "None") == "None":
        return {}
    name = job.get("Partition", "")
    mode = partition(name).get("PreemptMode", "unknown")
    cancels = "CANCEL" in mode.upper().split(",")
    return {
        "partition": name,
        "preempt_mode": mode,
        "preempt_requeue": setting,
        "requeued": setting == "true" or (setting == "auto" and not cancels),
    }


def requeue_on_preemption() -> bool:
    """Whether SLURM is preempting this job and kiln is to requeue it once checkpointed
    (:func:`preemption`), so that a SIGTERM is answered with a checkpoint and a requeue
    rather than a stop."""
    return bool(preemption().get("requeued"))


def requeue_if_preempted(stopped: SystemExit) -> None:
    """In the job, when SIGTERM ended it outside kiln's step loop (setup, validation: its
    attempt recorded ``stopped``, nothing new to checkpoint): requeue it if SLURM is
    preempting it, which it does not do itself for a job that ends within its grace time
    (rank 0 requeues and exits; elsewhere this returns)."""
    from kiln.core.distributed.stop import hand_over

    if getattr(stopped, "signal_name", None) == "SIGTERM" and requeue_on_preemption():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the requeue's own SIGTERM
        hand_over(preemption_signal())


class RequeueRefused(RuntimeError):
    """``scontrol requeue`` refused the job (e.g. a partition with ``PreemptMode=CANCEL``
    and ``--no-requeue``: "Requested operation is presently disabled")."""


def requeue_job(job_id: str, countdown: int) -> None:
    """``scontrol requeue <job_id>`` and submitit's log line for it ("Requeued job ..."), as
    submitit runs it, but a refusal keeps scontrol's own words (submitit's ``check_call``
    says only "returned non-zero exit status 1").

    Raises:
        RequeueRefused: scontrol failed; the message holds its reason.
    """
    import subprocess

    done = subprocess.run(
        ["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        reason = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
        raise RequeueRefused(f"scontrol requeue {job_id} was refused: {reason}")
    from submitit.core import logger

    logger.get_logger().info(f"Requeued job {job_id} ({countdown} remaining timeouts)")


def guard_requeue() -> None:
    """In the job, once submitit has installed its handlers: submitit's requeue handler
    runs once, and not while kiln's loop is stopping for a signal (kiln hands the stop over
    itself, ``kiln.core.distributed.stop.hand_over``, once the checkpoint and record are written):
    ``scancel --full`` and the batch shell deliver the same USR2 to a task more than once.
    While the loop stops, any further stop signal is dropped (SLURM's SIGKILL ends a stop
    that overruns)."""
    from kiln.core.distributed.stop import ignore_repeated_signals, requested_signal

    ignore_repeated_signals(any_signal=True)
    requeue = signal.getsignal(preemption_signal())
    if not callable(requeue):
        return
    env = getattr(getattr(requeue, "__self__", None), "env", None)  # submitit's SignalHandler
    if env is not None and callable(getattr(env, "_requeue", None)):
        env._requeue = lambda countdown: requeue_job(str(env.job_id), countdown)

    def guarded(signum: int, frame: Any) -> None:
        if _requeue_started[0] or requested_signal():
            note = f"kiln: {signal.Signals(signum).name} again: already stopping for one\n"
            os.write(sys.stderr.fileno(), note.encode())
            return
        _requeue_started[0] = True
        try:
            requeue(signum, frame)  # rank 0: requeues and exits (SystemExit); others return
        finally:
            # the job is requeued (its record written): SLURM's SIGTERM ends this task at
            # once, where ignoring it would hold the job COMPLETING until SIGKILL (KillWait)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    signal.signal(preemption_signal(), guarded)


def ignore_stop_signals() -> None:
    """In the job, once its work returned (its record written): a SIGTERM or the preemption
    signal from now on (``scancel``, SLURM's preemption of a job that is ending, the batch
    shell passing either on) has nothing to stop or requeue, and must not kill the task while
    submitit writes its result and the interpreter exits (SLURM would say ``FAILED``)."""
    for signum in (signal.SIGTERM, preemption_signal()):
        signal.signal(signum, signal.SIG_IGN)


def requeued_by_submitit(exc: BaseException | None) -> bool:
    """Whether ``exc`` is submitit's exit after it requeued this job (its handler ran on a
    preemption signal that came before kiln's loop took it over: the job's config or setup
    stage), rather than a failure."""
    return _requeue_started[0] and isinstance(exc, SystemExit) and exc.code == -1


def forget_earlier_result() -> None:
    """In the job: remove this task's result file of an earlier attempt. SLURM requeues a job
    that lost a node, whose rank 0 had ended that attempt with a result; once the new
    attempt's other tasks wrote theirs, the submitter would read that stale one as the job's."""
    import submitit

    submitit.JobEnvironment().paths.result_pickle.unlink(missing_ok=True)


def slurm_states(job_ids: Sequence[str]) -> dict[str, str] | None:
    """``{job id: state}`` of the jobs SLURM still knows (array tasks as ``<id>_<index>``);
    ``None`` when ``squeue`` gives no answer (then nothing is known to have ended)."""
    bases = sorted({job_id.split("_")[0] for job_id in job_ids})
    cmd = ["squeue", "--noheader", "--array", "--states=all", "--format=%i|%T"]
    try:
        proc = subprocess.run(
            [*cmd, f"--jobs={','.join(bases)}"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        # every id purged from the controller's memory (MinJobAge): none of them runs
        return {} if "Invalid job id" in proc.stderr else None
    return squeue_states(proc.stdout)


def squeue_states(out: str) -> dict[str, str]:
    """``squeue --noheader --format=%i|%T``'s lines as ``{job id: state}``."""
    states = {}
    for line in out.splitlines():
        job_id, _, state = line.strip().partition("|")
        if job_id:
            states[job_id] = state.strip()
    return states


def _log_tail(job: Any) -> str:
    try:
        lines = [line for line in job.paths.stderr.read_text().splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1].strip() if lines else "an empty log"


def _without_result(job: Any, record: dict[str, Any] | None) -> str:
    """What of a lost job left no result: all of it, or some tasks (a node lost under a
    multi-node job, whose rank 0 recorded how the job ended); or a job kiln stopped with a
    checkpoint (``record``: its ``summary.json`` of this sweep), whose tasks end by the
    signal rather than with a result."""
    from kiln.experiments.settings.job_info import STOPPED, TRAIN

    if record is not None and record.get("status") == STOPPED:
        preemption = record.get("preemption") or {}
        why = (
            f", preempted on partition {preemption.get('partition')} "
            f"(PreemptMode={preemption.get('preempt_mode')}, hydra.launcher.preempt_requeue="
            f"{preemption.get('preempt_requeue')}: not requeued)"
            if preemption
            else ""
        )
        return (
            f": kiln stopped it by {record.get('stop_signal')} at step "
            f"{record.get('global_step')} with a checkpoint{why}; its summary.json says "
            "stopped, and running the sweep again resumes it"
        )
    if record is not None and record.get("status") == TRAIN.failed_status and record.get("error"):
        return (
            f": kiln recorded it failed at step {record.get('global_step')} "
            f"({record['error']}); running the sweep again resumes it from its last checkpoint"
        )
    tasks = getattr(job, "num_tasks", 1)
    missing = [i for i in range(tasks) if not job.task(i).paths.result_pickle.exists()]
    if tasks == 1 or 0 in missing:
        return " without a result: it died before kiln could record it"
    return (
        f" with task(s) {missing} of {tasks} without a result (a node or a task lost); its "
        "rank 0 recorded the job (summary.json), and a re-run resumes it"
    )


def accounting_enabled() -> bool:
    """Whether the cluster keeps accounting, so that ``sacct`` answers (``scontrol show
    config``: ``AccountingStorageType`` other than ``accounting_storage/none``)."""
    try:
        proc = subprocess.run(
            ["scontrol", "show", "config"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return True  # no answer: leave submitit as it is
    return accounting_in(proc.stdout)


def accounting_in(config: str) -> bool:
    """Whether ``scontrol show config``'s output keeps accounting (no answer: assume so)."""
    for line in config.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "AccountingStorageType":
            return value.strip() != "accounting_storage/none"
    return True


def _follow_without_sacct(jobs: Sequence[Any]) -> None:
    """Stop ``jobs`` (and their tasks) from asking ``sacct``, which fails on every poll where
    accounting is off: their state stays ``UNKNOWN``, result files and ``squeue`` tell."""
    from submitit.slurm.slurm import SlurmInfoWatcher

    class NoSacct(SlurmInfoWatcher):
        def _make_command(self) -> None:
            return None

    watcher = NoSacct(delay_s=600)
    for job in jobs:
        for one in [job, *getattr(job, "_sub_jobs", [])]:
            one.watcher = watcher


def _record_since(job_dir: Path | None, since: float) -> dict[str, Any] | None:
    """The ``summary.json`` a job wrote in ``job_dir`` after ``since`` (epoch seconds)."""
    import json

    from kiln.experiments.settings.job_info import TRAIN

    if job_dir is None:
        return None
    path = job_dir / TRAIN.file
    try:
        if path.stat().st_mtime < since:
            return None  # an earlier sweep's
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def wait_for_results(
    jobs: Sequence[Any], names: Sequence[str], job_dirs: Sequence[Path | None] | None = None
) -> list[Any]:
    """Each submitit job's first task's result, waiting until every job ended.

    Args:
        jobs: The submitted submitit jobs.
        names: What to call each job in an error (``"#0 precision=32-true"``).
        job_dirs: Each job's output directory, where its ``summary.json`` says what kiln
            recorded of a job that left no result.

    Raises:
        SlurmJobLost: Jobs that SLURM reports ended, or does not know, left no result
            (all of them named, once every other job ended).
    """
    if not accounting_enabled():
        print(
            "kiln: SLURM accounting is off on this cluster (AccountingStorageType="
            "accounting_storage/none, so no sacct): following the jobs with squeue",
            file=sys.stderr,
            flush=True,
        )
        _follow_without_sacct(jobs)
    started = time.time() - 1  # summary.json files older than this are an earlier sweep's
    dirs = list(job_dirs) if job_dirs is not None else [None] * len(jobs)
    ended_at: dict[str, float] = {}
    lost: dict[str, str] = {}
    while True:
        running = [j for j in jobs if j.job_id not in lost and not j.done()]
        if not running:
            break
        states = slurm_states([j.job_id for j in running])
        now = time.monotonic()
        for job in running:
            state = None if states is None else states.get(job.job_id, "gone")
            if state is None or (state != "gone" and state not in ENDED_STATES):
                ended_at.pop(job.job_id, None)  # running again (requeued), or unknown
                continue
            if now - ended_at.setdefault(job.job_id, now) >= LOST_GRACE_S:
                lost[job.job_id] = state
        time.sleep(POLL_S)
    if lost:
        lines = [
            f"SLURM job {job.job_id} (sweep job {name}) ended "
            f"{'(no longer known to SLURM)' if lost[job.job_id] == 'gone' else lost[job.job_id]}"
            f"{_without_result(job, _record_since(job_dir, started))}; {job.paths.stderr} "
            f"ends: {_log_tail(job)}"
            for job, name, job_dir in zip(jobs, names, dirs, strict=True)
            if job.job_id in lost
        ]
        raise SlurmJobLost("\n".join(lines))
    return [job.results()[0] for job in jobs]


if __name__ == "__main__":
    # the job's first act; through this module's import name, which the launcher's job
    # side reads the deferred signal from (this file runs as __main__, a second copy)
    from kiln.experiments.launchers import slurm

    slurm.start_job(sys.argv[1:])
