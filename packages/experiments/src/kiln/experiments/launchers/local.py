"""kiln's local submitit sweeps (``launcher=local_submitit``): the sweep owns its jobs.

submitit's local executor starts one controller process per job (``python -m
submitit.local._local``), which starts the job's task. Left as it is, the sweep is not their
owner: a SIGTERM to the sweep ends it alone (its jobs train on, under PID 1), and a job that
ends without a result (kiln stopped it at a step boundary) ends the sweep with submitit's raw
``UncompletedJobError`` while the other jobs train on.

Here each controller runs in its own session (a terminal's Ctrl-C reaches the sweep, not the
controllers, whose own SIGINT would kill their task a second later) and gets SIGTERM when
the sweep's process dies (``PR_SET_PDEATHSIG``). :func:`wait_for_jobs` stops every job, with
SIGTERM to its controller (which passes it on to the task: kiln stops it at its next step
boundary with a checkpoint), when the sweep gets SIGTERM, SIGINT or SIGHUP, or when any job
ends without a result; a second such signal to the sweep kills the jobs at once. Once every
job ended, whatever a job's process group still holds is killed, and the sweep ends with one
line per job naming its state (:func:`job_states`) and the exit status a stop has.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

POLL_S = 0.2
"""How often the sweep looks at its jobs."""
GROUP_GRACE_S = 10.0
"""How long a job's process group may outlive its controller (W&B's service flushing)."""
SWEEP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""What stops the sweep, and with it every job."""


class SweepStopped(SystemExit):
    """The sweep stopped every job; the message names each one's state, one line a job."""


def _set_parent_death_signal() -> None:
    """In a controller, before it runs: SIGTERM when the sweep's process dies (Linux)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start_controller(
    folder: Path,
    command: str,
    tasks_per_node: int = 1,
    cuda_devices: str = "",
    timeout_min: float = 5.0,
    signal_delay_s: int = 30,
    stderr_to_stdout: bool = False,
    setup: Sequence[str] = (),
) -> subprocess.Popen:
    """submitit's ``start_controller`` (same environment, same command), with the controller
    in its own session, which the sweep kills as a whole, and SIGTERM at the sweep's death."""
    import shlex

    env = dict(os.environ)
    env.update(
        SUBMITIT_LOCAL_NTASKS=str(tasks_per_node),
        SUBMITIT_LOCAL_COMMAND=command,
        SUBMITIT_LOCAL_TIMEOUT_S=str(int(60 * timeout_min)),
        SUBMITIT_LOCAL_SIGNAL_DELAY_S=str(int(signal_delay_s)),
        SUBMITIT_LOCAL_NODEID="0",
        SUBMITIT_LOCAL_JOB_NUM_NODES="1",
        SUBMITIT_STDERR_TO_STDOUT="1" if stderr_to_stdout else "",
        SUBMITIT_EXECUTOR="local",
        CUDA_VISIBLE_DEVICES=cuda_devices,
        SUBMITIT_LOCAL_WITH_SHELL="1" if setup else "",
    )
    cmd: Any = [sys.executable, "-m", "submitit.local._local", str(folder)]
    if setup:
        cmd = " && ".join([*setup, shlex.join(cmd)])
    return subprocess.Popen(
        cmd,
        shell=bool(setup),
        env=env,
        start_new_session=True,
        preexec_fn=_set_parent_death_signal,
    )


def own_jobs(executor: Any) -> None:
    """Make ``executor`` (a ``submitit.AutoExecutor(cluster="local")``) start each job's
    controller with :func:`start_controller`."""
    from submitit.local.local import LocalExecutor, LocalJob

    class OwnedLocalExecutor(LocalExecutor):
        def _submit_command(self, command: str) -> LocalJob:
            params = self.parameters
            ntasks = params.get("tasks_per_node", 1)
            visible = params.get("visible_gpus", ())
            gpus = range(params.get("gpus_per_node", 0)) if visible == () else visible
            process = start_controller(
                folder=self.folder,
                command=command,
                tasks_per_node=ntasks,
                cuda_devices=",".join(str(k) for k in gpus),
                timeout_min=params.get("timeout_min", 2.0),
                signal_delay_s=params.get("signal_delay_s", 30),
                stderr_to_stdout=params.get("stderr_to_stdout", False),
                setup=params.get("setup", ()),
            )
            return LocalJob(
                folder=self.folder, job_id=str(process.pid), process=process, tasks=range(ntasks)
            )

    executor._executor.__class__ = OwnedLocalExecutor


def _signal_group(pgid: int, signum: int) -> bool:
    """``signum`` to process group ``pgid``; whether the group still had a process."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _record(job_dir: Path, since: float) -> dict[str, Any] | None:
    """The ``summary.json`` the job wrote in ``job_dir`` during this sweep (after ``since``)."""
    from kiln.experiments.settings.job_info import TRAIN

    path = job_dir / TRAIN.file
    try:
        if path.stat().st_mtime < since:
            return None
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def job_state(record: dict[str, Any] | None, returncode: int | None) -> str:
    """What became of a job, in a few words, from its ``summary.json`` of this sweep
    (``record``) and its controller's exit status."""
    from kiln.experiments.settings.job_info import FAILED_STATUSES, STOPPED

    if record is None:
        code = "" if returncode is None else f", exit status {returncode}"
        return f"ended before kiln recorded it{code}; running the sweep again starts it"
    status = record.get("status")
    step = record.get("global_step")
    if status == STOPPED:
        where = (
            f"with a checkpoint ({record['checkpoint']})"
            if record.get("checkpoint")
            else ("before its first checkpoint")
        )
        return (
            f"stopped by {record.get('stop_signal') or 'a signal'} at step {step} {where}; "
            "running the sweep again resumes it"
        )
    if status in FAILED_STATUSES:
        return f"{status} at step {step}: {record.get('error')}"
    return f"{status} at step {step}"


def _cause(jobs: Sequence[Any], names: Sequence[str], got: Sequence[int]) -> str:
    """Why the sweep stops its jobs: a signal it got, or a job that ended without a result
    (kiln stopped it, or it died); ``""``: no reason (yet)."""
    if got:
        return f"the sweep got {signal.Signals(got[0]).name}"
    for job, name in zip(jobs, names, strict=True):
        if job.done() and not job.paths.result_pickle.exists():
            return f"job {name} ended without a result"
    return ""


def _reap(groups: Sequence[int]) -> None:
    """Kill whatever the jobs' process groups still hold once their controllers ended (after
    :data:`GROUP_GRACE_S` for what is still finishing): nothing of a job outlives the sweep."""
    deadline = time.monotonic() + GROUP_GRACE_S
    while any(_signal_group(g, 0) for g in groups) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    for pgid in groups:
        _signal_group(pgid, signal.SIGKILL)


def wait_for_jobs(jobs: Sequence[Any], names: Sequence[str], job_dirs: Sequence[Path]) -> list:
    """Each job's result once every job ended, stopping them all on a stop (module doc).

    Args:
        jobs: The submitted ``LocalJob``s.
        names: What to call each job (``"#0 optimizer.lr=0.1"``).
        job_dirs: Each job's output directory (its ``summary.json``).

    Raises:
        SweepStopped: The sweep or a job was stopped: one line per job names its state; the
            exit status is 128 + the signal the sweep got, or 1 when a job stopped.
    """
    from kiln.core.distributed.stop import signal_handlers_restored

    started = time.time() - 1  # an earlier sweep's summary.json is older
    got: list[int] = []  # the signals the sweep got

    def on_signal(signum: int, frame: Any) -> None:
        got.append(signum)
        what = (
            "stopping every job at its next step boundary"
            if len(got) == 1
            else ("killing every job now")
        )
        os.write(2, f"kiln: {signal.Signals(signum).name}: {what}\n".encode())

    groups = [job._process.pid for job in jobs]  # each controller leads its own session
    cause, killed = "", False
    with signal_handlers_restored(SWEEP_SIGNALS):
        for signum in SWEEP_SIGNALS:
            signal.signal(signum, on_signal)
        while any(job._process.poll() is None for job in jobs):
            if not cause and (cause := _cause(jobs, names, got)):
                for job in jobs:  # the controller passes it on to its task
                    if job._process.poll() is None:
                        job._process.send_signal(signal.SIGTERM)
            if len(got) > 1 and not killed:  # a second signal: no waiting for a step
                killed = True
                for pgid in groups:
                    _signal_group(pgid, signal.SIGKILL)
            time.sleep(POLL_S)
        _reap(groups)
        cause = cause or _cause(jobs, names, got)
    if not cause:
        return [job.results()[0] for job in jobs]
    raise _stopped(cause, jobs, names, job_dirs, started, got)


def _stopped(
    cause: str,
    jobs: Sequence[Any],
    names: Sequence[str],
    job_dirs: Sequence[Path],
    started: float,
    got: Sequence[int],
) -> SweepStopped:
    """The sweep's last words, printed: one line per job (and per refused job)."""
    from kiln.experiments.settings.job_files import read_refusals

    lines = [
        f"job {name}: {job_state(_record(job_dir, started), job._process.returncode)}"
        for job, name, job_dir in zip(jobs, names, job_dirs, strict=True)
    ]
    if job_dirs:  # a job refused in an earlier job's directory left a note, not a record
        notes = read_refusals(Path(job_dirs[0]).parent)
        lines += [f"job {note['job']} refused: {note['error']}" for note in notes]
    print(f"sweep stopped ({cause}):\n" + "\n".join(lines), file=sys.stderr, flush=True)
    return SweepStopped(128 + got[0] if got else 1)
