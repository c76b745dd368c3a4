"""kiln's SLURM jobs (``launcher=slurm``): a preemption signal at any moment of a job's life
requeues it, and the submitter never waits on a job that SLURM no longer has.

Job side. submitit installs its USR2 handler (checkpoint and requeue) only once it has
loaded the job's pickle, seconds after the process started; a USR2 before that (SLURM's
time-limit warning, a preemption notice) took the default action and killed every task
unrecorded. SLURM therefore runs :func:`start_job` in place of submitit's own entry
(``python -u -m kiln.experiments.slurm -u -m submitit.core._submit <folder>``): its first
act defers the signal, and the job replays it once submitit's handler is in place
(:func:`replay_deferred_signal`), where it requeues the job like any later USR2. Only the
interpreter's own start-up (before any Python line runs) is left unguarded.

Submitter side. submitit learns that a job ended from its result file or from ``sacct``.
Where accounting is off (``sacct``: "Slurm accounting storage is disabled", as on the
local test cluster) a job that died without a result (killed at start-up, OOM-killed,
``scancel``) read ``UNKNOWN`` forever, and ``kiln-train -m`` polled for ever.
:func:`wait_for_results` also asks ``squeue``: a job that SLURM reports ended (or no
longer knows) and that left no result within :data:`LOST_GRACE_S` fails the sweep with
:class:`SlurmJobLost`, naming the job, its state and its log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
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


class SlurmJobLost(RuntimeError):
    """SLURM no longer runs a job of the sweep, and the job left no result."""


def preemption_signal() -> signal.Signals:
    """The signal submitit requeues on (``SUBMITIT_PREEMPT_SIGNAL``, default USR2)."""
    name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
    return signal.Signals["SIG" + name]


def _defer(signum: int, frame: Any) -> None:
    _deferred.append(signum)
    # os.write: print() may be the very call this handler interrupted
    note = f"kiln: {signal.Signals(signum).name} while the job starts: it requeues once started\n"
    os.write(sys.stderr.fileno(), note.encode())


def start_job(argv: Sequence[str]) -> None:
    """Run a submitit job (``argv``: submitit's ``-u -m submitit.core._submit <folder>``),
    the preemption signal deferred until submitit's own handler is in place."""
    signal.signal(preemption_signal(), _defer)  # first: the imports below take seconds
    if not argv:
        raise SystemExit("usage: python -m kiln.experiments.slurm ... <submitit folder>")
    from submitit.core.submission import process_job

    process_job(argv[-1])


def replay_deferred_signal() -> None:
    """In the job, once submitit has installed its handlers: act on a preemption signal
    that arrived before (submitit requeues the job and exits, on rank 0)."""
    if _deferred:
        signum = _deferred[0]
        _deferred.clear()
        signal.raise_signal(signum)  # the Python handler runs before this returns


def forget_earlier_result() -> None:
    """In the job: remove this task's result file of an earlier attempt. SLURM requeues a job
    that lost a node, whose rank 0 had ended that attempt with a result; once the new
    attempt's other tasks wrote theirs, the submitter would read that stale one as the job's."""
    import submitit

    submitit.JobEnvironment().paths.result_pickle.unlink(missing_ok=True)


def job_command(python: str = sys.executable) -> str:
    """What submitit's executor runs in place of ``python`` (see the module doc)."""
    import shlex

    return f"{shlex.quote(python)} -u -m kiln.experiments.slurm"


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
    states = {}
    for line in proc.stdout.splitlines():
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


def _without_result(job: Any) -> str:
    """What of a lost job left no result: all of it, or some tasks (a node lost under a
    multi-node job, whose rank 0 recorded how the job ended)."""
    tasks = getattr(job, "num_tasks", 1)
    missing = [i for i in range(tasks) if not job.task(i).paths.result_pickle.exists()]
    if tasks == 1 or 0 in missing:
        return " without a result: it died before kiln could record it"
    return (
        f" with task(s) {missing} of {tasks} without a result (a node or a task lost); its "
        "rank 0 recorded the job (summary.json), and a re-run resumes it"
    )


def wait_for_results(jobs: Sequence[Any], names: Sequence[str]) -> list[Any]:
    """Each submitit job's first task's result, waiting until every job ended.

    Args:
        jobs: The submitted submitit jobs.
        names: What to call each job in an error (``"#0 precision=32-true"``).

    Raises:
        SlurmJobLost: Jobs that SLURM reports ended, or no longer knows, left no result
            (all of them named, once every other job ended).
    """
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
            f"{_without_result(job)}; {job.paths.stderr} ends: {_log_tail(job)}"
            for job, name in zip(jobs, names, strict=True)
            if job.job_id in lost
        ]
        raise SlurmJobLost("\n".join(lines))
    return [job.results()[0] for job in jobs]


if __name__ == "__main__":
    # the job's first act; through this module's import name, which the launcher's job
    # side reads the deferred signal from (this file runs as __main__, a second copy)
    from kiln.experiments import slurm

    slurm.start_job(sys.argv[1:])
