"""One job's life, the same for every kind of job: a record, a tracker, a status, a file.

``kiln-train`` and ``kiln-bench`` (and any later job kind: evaluation, export) run their
work inside a :class:`Lifecycle`::

    with Lifecycle(job, TRAIN, {"model": ...}, summarize=...) as life:
        with stage("config"):
            resolved = ...                            # a failure here opens no W&B run
        life.track(LoggerConfig(**resolved["logger"]), config=resolved, tags=...)
        life.record.update(status="ok", **work(life.loggers))
    return life.record

Whatever happens inside, the lifecycle turns an exception into the record's failed status,
a one-line reason (and the stage it happened in), writes the traceback to
``<job dir>/error.log``, puts the final values into the tracker's summary, finishes the
tracker with the status, and writes the record (``summary.json``, ``bench.json``)
atomically. An attempt refused before its tracker opened leaves the record of an earlier
attempt that did work (a finished job's) as it was, but for its ``attempts``, and never
touches its W&B run; so does one that finds nothing to do (:meth:`Lifecycle.keep`).
``Exception`` is swallowed (one failed job never stops a sweep); Ctrl-C and
SIGTERM are recorded, then propagate (away from a step boundary: ``status: stopped`` and
``stopped_in``, where); one that comes while the job ends acts once its record is written
(a job that ended ``ok`` ends so, and its process starts no further job).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kiln.experiments.jobs.stages import stage_of
from kiln.experiments.settings import job_files
from kiln.experiments.settings.base import LoggerConfig
from kiln.experiments.settings.job_files import write_job_json
from kiln.experiments.settings.job_info import STOPPED, JobInfo, RecordKind, machine_info
from kiln.experiments.settings.startup_gc import startup_frozen
from kiln.experiments.tracking.tracker import Tracker

log = logging.getLogger(__name__)

ERROR_LOG = "error.log"


class JobFailed(RuntimeError):
    """A single (non-sweep) job failed (its entry point raises it to exit non-zero)."""


def one_line_reason(exc: BaseException) -> str:
    """``"<Type>: <message>"`` on one line; a worker failure names the worker's own exception
    (the last line of its traceback) and its rank instead of carrying the whole traceback."""
    # Only a run that launched workers has imported kiln.core.distributed.launch (and Fabric
    # with it); a config error is reported without importing them.
    launch = sys.modules.get("kiln.core.distributed.launch")
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if launch is not None and isinstance(exc, launch.WorkerFailedError) and len(lines) > 1:
        return name_peers(f"{lines[-1]} (in {lines[0].rstrip(':')})")
    return name_peers(f"{type(exc).__name__}: {' '.join(lines)}")


# a peer as gloo names it: "Connection closed by peer [10.77.0.11]:27286", "Read error
# [10.77.0.11]:38559: Connection reset by peer"
_PEER = re.compile(r"(\[([0-9a-fA-F.:]+)\]:\d+)")


def name_peers(reason: str) -> str:
    """``reason`` with the host name after each peer address gloo names (``Connection closed
    by peer [10.77.0.11]:27286`` -> ``... (node1)``): on a multi-node job, the node that was
    lost."""

    def named(match: re.Match[str]) -> str:
        try:
            host = socket.gethostbyaddr(match.group(2))[0]
        except OSError:  # no name for it: the address says what there is
            return match.group(1)
        return f"{match.group(1)} ({host})"

    return _PEER.sub(named, reason)


class Terminated(SystemExit):
    """SIGTERM (SLURM time limits, timeout(1), kill): the process exits ``128 + signal``."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signal_name = signal.Signals(signum).name

    def __str__(self) -> str:
        return f"terminated by {self.signal_name}"


class Requeued(SystemExit):
    """SLURM's USR2 (preemption, time limit) or its preemption SIGTERM stopped the job at a
    step boundary with a checkpoint; once its record is written, submitit requeues it
    (``record``: the record; ``signal_name``: the signal that stopped it)."""

    def __init__(self, record: dict[str, Any], signal_name: str = "SIGUSR2") -> None:
        super().__init__(-1)  # submitit's own exit code for a requeue
        self.record = record
        self.signal_name = signal_name

    def __str__(self) -> str:
        return (
            f"stopped by {self.signal_name} at a step boundary with a checkpoint; "
            "requeued by submitit"
        )


_PEAKS: dict[tuple[str, str], tuple[Any, Any]] = {}
"""This process's measured matmul and copy peaks, by (device, precision)."""


def _calibration_device(accelerator: str) -> str:
    """The device a job at ``accelerator`` computes on (this process's local GPU, or CPU)."""
    import torch

    if accelerator in ("auto", "cuda", "gpu") and torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    return "cpu"


def _terminated(signum: int, frame: Any) -> None:
    raise Terminated(signum)


_after_ok: list[int] = []
"""A stop signal held while a job of this process ended ``ok``: the job ends as its record
says (a SLURM job exits 0: ``COMPLETED``, neither requeued nor lost) and the process starts
no further job (a sweep's next, under Hydra's basic launcher): that one stops at once."""


def _end_ok_after(signum: int) -> None:
    """A job ended ``ok`` with ``signum`` held: note it (:data:`_after_ok`), and keep any
    further SIGTERM or SIGINT from interrupting the process's own end (SLURM's batch shell
    passes its SIGTERM on to the tasks: the same signal again, moments later)."""
    _after_ok.append(signum)
    note = f"{signal.Signals(signum).name} as the job ended: it ended ok\n"
    os.write(sys.stderr.fileno(), note.encode())
    if threading.current_thread() is threading.main_thread():
        for stop in (signal.SIGTERM, signal.SIGINT):
            signal.signal(stop, lambda *_: None)


class _Held(Exception):
    """Ends a best-effort block a stop signal came in (``Lifecycle._held_signals``)."""


class Lifecycle:
    """The record, tracker and result file of one job (a context manager around its work).

    Args:
        job: The job's identity.
        kind: Which record the job writes
            (:data:`~kiln.experiments.settings.job_info.TRAIN`, ``BENCH``).
        fields: The kind's own fields of the record, added to the job's skeleton.
        writer: Whether this process tracks and writes (global rank 0 of a multi-process job).
        summarize: The tracker's final summary, made from the record once the work ended.
        progress: What a failed piece of work had completed, read from its exception.
        on_exit: Called with the exception (or ``None``) once the work ended, before the
            record is written (``kiln-train`` records how the attempt ended).
        keep_progress: ``(earlier record, failed record) -> record``: what an attempt that
            failed after its tracker opened writes, given the job's record as it stood
            before (``kiln-train`` keeps the steps, rows and metrics an attempt that got
            less far would erase: a record never holds less than it did).
    """

    def __init__(
        self,
        job: JobInfo,
        kind: RecordKind,
        fields: dict[str, Any] | None = None,
        *,
        writer: bool = True,
        summarize: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        progress: Callable[[BaseException], dict[str, Any]] | None = None,
        on_exit: Callable[[BaseException | None], None] | None = None,
        keep_progress: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        self.job = job
        self.kind = kind
        self.record: dict[str, Any] = {**job.record(kind), "error_stage": None, **(fields or {})}
        if self.record.get("machine") is None:
            self.record["machine"] = machine_info()
        for key in ("wandb", "config"):
            self.record.setdefault(key, None)
        self.writer = writer
        self.summarize = summarize
        self.progress = progress
        self.on_exit = on_exit
        self.keep_progress = keep_progress
        self.before: dict[str, Any] | None = None  # the record as this attempt found it
        self.tracker: Tracker | None = None
        self.kept: dict[str, Any] | None = None  # the earlier record a refused attempt keeps
        self.unchanged = False  # the work found nothing to do: the earlier record stays (keep)
        self.held = 0  # a stop signal held while the job ends (_held_signals)
        self._held: contextlib.AbstractContextManager[None] | None = None  # job_files.held

    @property
    def loggers(self) -> list[Any]:
        """The tracker's Fabric loggers (none before :meth:`track`, or off the writer)."""
        return self.tracker.loggers if self.tracker else []

    @property
    def failed(self) -> bool:
        return self.record["status"] == self.kind.failed_status

    @property
    def refused(self) -> bool:
        """Whether the job failed before its tracker opened (before any work)."""
        return self.failed and self.tracker is None

    def earlier_record(self) -> dict[str, Any] | None:
        """The job directory's record of an earlier attempt that did work, if any."""
        try:
            record = json.loads((Path(self.job.output_dir) / self.kind.file).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict):
            return None
        worked = record.get("status") != self.kind.failed_status or record.get("global_step")
        return record if worked else None

    def keep(self, earlier: dict[str, Any]) -> None:
        """End the job with ``earlier`` (:meth:`earlier_record`) as its record, as it was but
        for its ``attempts``: the work found nothing to do (a finished job re-run without
        steps left), and an attempt that did nothing changes no figure of the job. Call it
        before :meth:`track`: the W&B run is never reopened."""
        self.kept, self.unchanged = earlier, True
        self.record = dict(earlier)

    def track(
        self, cfg: LoggerConfig, *, config: dict[str, Any], tags: list[str], resume: bool = False
    ) -> None:
        """Open the job's W&B run (or CSV logger) and record where it is; writer only
        (``resume``: continue the run of an earlier attempt in this job directory)."""
        if not self.writer:
            return
        job_files.take(self.job.output_dir)  # the run starts: the job directory is its own
        config = {**config, "machine": self.record["machine"]}
        self.tracker = Tracker(cfg, self.job, config=config, tags=tags, resume=resume)
        self.tracker.start()
        self.record["wandb"] = self.tracker.info

    @contextlib.contextmanager
    def measured(self, accelerator: str, precision: str) -> Iterator[None]:
        """Around the job's measured work (training, benchmarking): the machine's load
        and a calibration (:func:`kiln.core.telemetry.machine.calibrate` on the job's device,
        at its precision, with the load of other work while it ran) just before and just
        after, into ``record["machine"]`` (``load_start``/``load_end``,
        ``calibration_before``/``calibration_after``; before, also ``matmul_peak`` and
        ``copy_peak``: :func:`kiln.core.telemetry.machine.measured_peak`,
        :func:`~kiln.core.telemetry.machine.measured_bandwidth`) and the W&B run's config.
        What start-up built is frozen out of garbage collection first
        (:mod:`kiln.experiments.settings.startup_gc`)."""
        with startup_frozen():
            if not self.writer:  # one record: rank 0 measures its own device
                yield
                return
            with self._calibrated(accelerator, precision):
                yield

    @contextlib.contextmanager
    def _calibrated(self, accelerator: str, precision: str) -> Iterator[None]:
        from kiln.core.telemetry.machine import (
            calibrate_under_load,
            measured_bandwidth,
            measured_peak,
        )

        device = _calibration_device(accelerator)
        machine = self.record["machine"]
        # what "achieved / measured peak" divides by: the same cores on a large matmul, and
        # its memory on a large copy; once per process (a sweep's jobs share one denominator)
        if (device, precision) not in _PEAKS:
            _PEAKS[device, precision] = measured_peak(device, precision), measured_bandwidth(device)
        machine["matmul_peak"], machine["copy_peak"] = _PEAKS[device, precision]
        machine["calibration_before"], machine["load_start"] = calibrate_under_load(
            device, precision
        )
        if self.tracker is not None:
            self.tracker.update_config({"machine": machine})
        try:
            yield
        finally:
            # best effort: after a failed step (CUDA out of memory) the work's error is the news;
            # SIGTERM or Ctrl-C skips it, and acts once the record is written
            with contextlib.suppress(Exception), self._held_signals(abort=True):
                machine["calibration_after"], machine["load_end"] = calibrate_under_load(
                    device, precision
                )

    def __enter__(self) -> Lifecycle:
        if _after_ok:  # the signal came as the job before ended: this one does not start
            signum = _after_ok.pop()
            raise Terminated(signum) if signum == signal.SIGTERM else KeyboardInterrupt
        if self.writer:
            earlier = self.earlier_record()
            if self.keep_progress is not None:
                self.before = earlier
            # an earlier job's directory is this run's only once its work starts (track)
            self._held = job_files.held(self.job.output_dir, owned=earlier is None)
            self._held.__enter__()
            hydra_dir = Path(self.job.output_dir) / job_files.HYDRA_DIR
            for name, text in self.job.hydra_files.items():
                job_files.write(hydra_dir / name, text)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _terminated)  # SLURM time limits, timeout(1), kill
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        with self._held_signals():  # the record and the tracker's end are written whole
            try:
                if exc is not None:
                    if self.writer and self.tracker is None:
                        self.kept = self.earlier_record()
                    self._record_failure(exc)
                if self.on_exit is not None and self.writer:
                    self.on_exit(exc)
            finally:
                try:
                    self._finish(stopping=exc is not None and not isinstance(exc, Exception))
                finally:
                    if self._held is not None:
                        self._held.__exit__(None, None, None)
        if self.held and exc is None and self.record["status"] == "ok":  # the job ended whole
            _end_ok_after(self.held)
        elif self.held and not isinstance(exc, Requeued):  # it stops the process now
            signal.raise_signal(self.held)
        # A failed job must not stop the sweep; Ctrl-C and SIGTERM stop the process.
        return isinstance(exc, Exception)

    @contextlib.contextmanager
    def _held_signals(self, abort: bool = False) -> Iterator[None]:
        """Inside, the first SIGTERM or SIGINT is held in ``self.held`` (``abort``: and the block
        ends with ``_Held``, an ``Exception``); a second acts at once. Main thread only."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = (signal.SIGTERM, signal.SIGINT)
        saved = {s: signal.getsignal(s) for s in signals}

        def hold(signum: int, frame: Any) -> None:
            if self.held:
                restore()
                signal.raise_signal(signum)
                return
            self.held = signum
            note = f"{signal.Signals(signum).name}: stopping once the job's record is written\n"
            os.write(sys.stderr.fileno(), note.encode())
            if abort:
                raise _Held(signum)

        def restore() -> None:
            for signum, handler in saved.items():
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

        for signum in signals:
            signal.signal(signum, hold)
        try:
            yield
        finally:
            restore()

    def _record_failure(self, exc: BaseException) -> None:
        self.record.update(
            {
                "status": self.kind.failed_status,
                self.kind.reason_key: one_line_reason(exc),
                "error_stage": stage_of(exc),
                **(self.progress(exc) if self.progress else {}),
            }
        )
        self.record.update(self._stop_fields(exc))
        trace = "".join(traceback.format_exception(exc))
        if self.writer:
            self.record["traceback_file"] = self._write_traceback(trace)
        log.debug("job %s failed:\n%s", self.job.run_name, trace)

    def _write_traceback(self, trace: str) -> str:
        """``<job dir>/error.log``; for an attempt refused in an earlier job's directory (the
        directory is not its to write), a file in the system's temporary directory."""
        if job_files.state(self.job.output_dir) == "owned":
            path = Path(self.job.output_dir) / ERROR_LOG
            job_files.write(path, trace)
            return ERROR_LOG
        import tempfile

        fd, name = tempfile.mkstemp(prefix="kiln-refused-", suffix=".log")
        with os.fdopen(fd, "w") as handle:
            handle.write(trace)
        return name

    def _stop_fields(self, exc: BaseException) -> dict[str, Any]:
        """A record that says why its work stopped (``stop_reason``), stopped by SIGTERM or
        Ctrl-C away from a step boundary: ``stop_reason``, ``stop_signal`` and ``stopped_in``
        (the stage, and where in it: ``train: the first batch``, ``train: validation at step
        4``)."""
        if "stop_reason" not in self.record or self.record["stop_reason"] == "signal":
            return {}
        if isinstance(exc, Terminated):
            name = exc.signal_name
        elif isinstance(exc, KeyboardInterrupt):
            name = "SIGINT"
        else:
            return {}
        where = [stage_of(exc), getattr(exc, "kiln_stop_phase", None)]
        return {
            "stop_reason": "signal",
            "stop_signal": name,
            "stopped_in": ": ".join(w for w in where if w) or "start",
        }

    def _finish(self, stopping: bool = False) -> None:
        # the record first: a job SLURM is requeueing or killing may not outlive W&B's finish
        if self.writer:
            record = self.record
            if self.kept is not None and (self.refused or self.unchanged):  # this attempt only
                attempts = {k: v for k, v in self.record.items() if k == "attempts" and v}
                record = {**self.kept, **attempts}
            elif self.before is not None and self.keep_progress is not None:
                if self.failed or record["status"] == "requeued":  # e.g. while it started
                    record = self.record = self.keep_progress(self.before, record)
                elif record.get("stopped_in"):  # stopped away from a step boundary
                    stop = {k: record[k] for k in ("stop_reason", "stop_signal")}
                    record = self.record = {**self.keep_progress(self.before, record), **stop}
            job_dir = self.job.output_dir
            write_job_json(Path(job_dir) / self.kind.file, job_files.relocatable(record, job_dir))
        if self.tracker is None:
            return
        try:
            self._finish_tracker()
        except Exception as error:
            if not stopping and not self.held:
                raise
            # SLURM signals every process of the job, W&B's service too: the stop (a requeue,
            # or a job that had ended) goes on, and its re-run logs the rows the run lacks
            log.warning("finishing the W&B run failed while stopping: %r", error)
            self.tracker.abandon()

    def _finish_tracker(self) -> None:
        assert self.tracker is not None
        self.tracker.update_config({"machine": self.record["machine"]})
        if self.summarize:
            self.tracker.summarize(self.summarize(self.record))
        reason = self.record[self.kind.reason_key] if self.failed else None
        status = self.record["status"]
        if status != STOPPED:  # a train job stopped at a step boundary says so
            status = "failed" if self.failed else "ok"
        self.tracker.finish(status, reason)
