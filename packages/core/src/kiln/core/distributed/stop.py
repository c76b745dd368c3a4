"""Stop at the next step boundary: a signal asks, the loop saves a checkpoint and returns.

A job wraps ``fit`` in :func:`stop_on_signals` (``kiln-train`` does, on every rank, for
SIGTERM, SIGINT and SIGUSR2). While the loop runs its steps, the first such signal only
records a stop request; the loop polls it after each optimizer step, on every rank at the
same step (:class:`StopPoll`: with several processes the ranks all-reduce the request, so a
signal that reached one rank stops them all), saves a checkpoint there (as a periodic one:
no extra log row or validation) and returns with ``stop_reason="signal"`` and
``stop_signal`` naming it. The job then re-raises the signal (``signal.raise_signal``) to
run the handler that was installed before: exit 143 for SIGTERM, ``KeyboardInterrupt``, submitit's
checkpoint-and-requeue for SIGUSR2. A signal outside the step loop (setup, compile,
validation before the first step, after the loop), or a second one, goes straight to that
previous handler, as without kiln (a launched worker drops a repeat of the same signal, a
SLURM job any stop signal while it stops: :func:`ignore_repeated_signals`). A job that acts
on the stop by re-raising it to the previous handler calls :func:`hand_over`.

Where no step boundary is near, SIGTERM and SIGINT act at once, through the previous handler,
and the exception it raises names where (``kiln_stop_phase``): before the first step ends
(the first batch: a shuffle buffer's fill; the first step: compilation), nothing is lost
since the run started or resumed. A single process's validation runs after its step is
done: it checks after each batch (:func:`stop_requested_in_validation`), ends there without
metrics, and the run stops at that step like any other, with its checkpoint (the step's
training is kept; its validation is not recorded). SLURM jobs and several processes finish
the validation first.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Generator, Iterable
from contextlib import contextmanager
from typing import Any, ClassVar, cast

import torch

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)
"""What ``kiln-train`` turns into a stop at the next step boundary."""
AT_ONCE = (signal.SIGTERM, signal.SIGINT)
"""What acts at once where no step boundary is near (see the module doc)."""


class _Request:
    """This process's stop request (a signal handler writes it, the loop reads it)."""

    signum = 0  # 0: none
    listening = False  # the loop is between steps and will honour a request
    repeats_ignored = False  # a worker of kiln.core.launch: see ignore_repeated_signals
    others_ignored = False  # a SLURM job: any stop signal while stopping is dropped
    far: str | None = None  # while listening: a stretch with no step boundary near
    checked = False  # far is a stretch that checks (act_on_stop_request), not the handler
    agent = 0  # a worker of kiln.core.launch: its launch agent's pid (follow_agent)
    previous: ClassVar[dict[int, Any]] = {}  # the handlers stop_on_signals replaced


_REQUEST = _Request()


def request_stop(signum: int) -> bool:
    """Ask the running loop to stop at its next step boundary, as if ``signum`` arrived.

    Returns:
        Whether the request was taken: ``False`` when no loop is running its steps in this
        process, or a stop was already requested (then the caller acts at once).
    """
    if not _REQUEST.listening or _REQUEST.signum:
        return False
    _REQUEST.signum = int(signum)
    return True


def ignore_repeated_signals(any_signal: bool = False) -> None:
    """In this process, drop a stop signal that repeats the one already being acted on,
    instead of passing it to the previous handler (a user's second Ctrl-C that forces).

    For ``kiln.core.launch``'s workers: the kernel sends their parent-death signal once per
    exiting thread of a killed parent, and the agent's own kill comes 30 s after its relay.

    Args:
        any_signal: Drop any stop signal while the loop stops, not only a repeat (a SLURM
            job: ``scancel --full`` and the batch shell deliver one signal twice, and SLURM
            follows its own with SIGTERM, then SIGKILL; the stop under way is the best use
            of that time).
    """
    _REQUEST.repeats_ignored = True
    _REQUEST.others_ignored = _REQUEST.others_ignored or any_signal


def follow_agent(pid: int) -> None:
    """In a worker of ``kiln.core.launch``: ``pid`` is its launch agent, whose death stops this
    process at the next step boundary (torch's parent-death SIGINT; :func:`stop_if_agent_died`)."""
    _REQUEST.agent = pid


def stop_if_agent_died() -> bool:
    """Whether this process is stopping: a stop was requested, or this is a launched worker
    whose agent has died, and the stop its parent-death SIGINT asks for is requested now.
    That signal can come a moment after the agent's W&B service is gone (it ends with the
    agent): a step that fails to log in between must not fail the run."""
    if _REQUEST.agent and os.getppid() != _REQUEST.agent:
        request_stop(signal.SIGINT)
    return bool(_REQUEST.signum)


def requested_signal() -> int:
    """The signal whose stop this process requested, or that the last ``fit`` stopped for
    on any of its ranks (0: none)."""
    return _REQUEST.signum


def hand_over(signum: int) -> None:
    """Act on the stop this process took, now that its checkpoint is written: forget the
    request and raise ``signum`` (the handler installed before ``fit``'s runs before this
    returns, and from now on gets every such signal)."""
    _REQUEST.signum = 0
    signal.raise_signal(signum)


@contextmanager
def listening() -> Generator[None, None, None]:
    """The loop's step phase: a stop request is honoured at the next boundary (``fit``)."""
    _REQUEST.signum, _REQUEST.listening, _REQUEST.far = 0, True, None
    try:
        yield
    finally:
        _REQUEST.listening, _REQUEST.far = False, None


def _far(where: str | None, checked: bool = False) -> None:
    _REQUEST.far, _REQUEST.checked = where, checked


def _act_now(signum: int, frame: Any, where: str) -> None:
    """Pass ``signum`` to the handler installed before, noting ``where`` on what it raises."""
    note = f"{signal.Signals(signum).name} during {where}: stopping now\n"
    os.write(sys.stderr.fileno(), note.encode())
    _REQUEST.signum, _REQUEST.far = 0, None
    try:
        _call_previous(_REQUEST.previous.get(signum, signal.SIG_DFL), signum, frame)
    except BaseException as stop:
        stop.kiln_stop_phase = where  # type: ignore[attr-defined]
        raise


def stop_requested_in_validation() -> bool:
    """Whether a SIGTERM or SIGINT came during the stretch of the loop that checks (a single
    process's validation, after each batch): it ends there, and the run stops at its step
    with a checkpoint (see the module doc)."""
    return _REQUEST.far is not None and _REQUEST.checked and bool(_REQUEST.signum)


def _call_previous(previous: Any, signum: int, frame: Any) -> None:
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)  # the default action: end the process
        signal.raise_signal(signum)


@contextmanager
def signal_handlers_restored(signals: Iterable[int]) -> Generator[dict[int, Any], None, None]:
    """Put the handlers of ``signals`` back on exit; yields them (``{signum: handler}``).
    Only the main thread can set handlers: elsewhere yields ``{}`` and restores nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield {}
        return
    saved = {int(s): signal.getsignal(s) for s in signals}
    try:
        yield saved
    finally:
        for signum, old in saved.items():
            signal.signal(signum, old if old is not None else signal.SIG_DFL)


@contextmanager
def stop_on_signals(signals: Iterable[int] = STOP_SIGNALS) -> Generator[None, None, None]:
    """Turn ``signals`` into a stop at the next step boundary while inside (main thread only;
    elsewhere a no-op). Handlers installed before are restored on exit and get any signal
    the loop does not take (see the module doc)."""
    with signal_handlers_restored(signals) as previous:

        def handler(signum: int, frame: Any) -> None:
            far = _REQUEST.far is not None and signum in AT_ONCE and not _REQUEST.others_ignored
            if far and not _REQUEST.checked and _REQUEST.listening and not _REQUEST.signum:
                _act_now(signum, frame, cast(str, _REQUEST.far))
            elif far and request_stop(signum):
                name = signal.Signals(signum).name
                note = f"{name}: stopping at the next batch of {_REQUEST.far}\n"
                os.write(sys.stderr.fileno(), note.encode())
            elif request_stop(signum):
                # os.write: print() may be the very call this handler interrupted
                note = f"{signal.Signals(signum).name}: stopping at the next step boundary\n"
                os.write(sys.stderr.fileno(), note.encode())
            elif (
                _REQUEST.repeats_ignored
                and _REQUEST.listening
                and (signum == _REQUEST.signum or _REQUEST.others_ignored)
            ):
                pass  # already stopping for it
            else:
                _call_previous(previous[signum], signum, frame)

        outer, _Request.previous = _Request.previous, previous
        for signum in previous:
            signal.signal(signum, handler)
        try:
            yield
        finally:
            _Request.previous = outer


class StopPoll:
    """Whether to stop at this step boundary, decided alike on every rank.

    One process reads its own request. Several all-reduce it (max of the signal numbers)
    after every step, over a gloo group on host memory, so on GPUs it syncs no device (NCCL
    jobs get a side gloo group). As the run's last callback, its ``on_step_end`` leaves the
    answer in :attr:`signum` (no poll after the run's last step: every rank ends there).

    Args:
        fabric: The run's Fabric (after ``launch``).
        total_steps: The step the run ends at.
    """

    def __init__(self, fabric: Any, total_steps: int | None = None) -> None:
        self.total_steps, self.signum = total_steps, 0
        self.step: int | None = None  # the last step this attempt ended
        self.distributed = fabric.world_size > 1 and torch.distributed.is_initialized()
        self.group: torch.distributed.ProcessGroup | None = None
        if self.distributed and torch.distributed.get_backend() != "gloo":
            # collective, every rank a member (so a group, never the non-member int)
            self.group = cast(
                torch.distributed.ProcessGroup, torch.distributed.new_group(backend="gloo")
            )
        self._flag = torch.zeros(1, dtype=torch.int32)

    def on_loop_start(self, fit: Any) -> None:
        _far("the first batch")  # a shuffle buffer's fill, the loader's workers starting

    def on_window_start(self, window: list[Any]) -> None:
        if self.step is None:
            _far("the first step")  # compilation

    def on_step_end(self, step: int) -> None:
        self.step = step
        _far(None)
        self.signum = self() if self.total_steps is None or step < self.total_steps else 0

    def on_validation_start(self) -> None:
        # one process: the stop is its own (ranks would stop at different batches); a stop
        # already requested has its checkpoint after this validation
        if not self.distributed and not _REQUEST.signum:
            _far(f"validation at step {self.step or 0}", checked=True)

    def on_validation_end(self) -> None:
        if stop_requested_in_validation():  # one process: its own request is the answer
            self.signum = _REQUEST.signum
        _far(None if self.step is not None else "the first batch")

    def __call__(self) -> int:
        """The signal number a stop was requested for on any rank, or 0 (a rank that
        learns of a stop through the all-reduce records it as its own request too)."""
        if not self.distributed:
            return _REQUEST.signum
        self._flag.fill_(_REQUEST.signum)
        torch.distributed.all_reduce(self._flag, torch.distributed.ReduceOp.MAX, self.group)
        agreed = int(self._flag.item())
        # a request taken while this rank waited here (after its 0 went out) is kept for the
        # next poll: overwritten by this answer, it would be lost
        if agreed:
            _REQUEST.signum = agreed
        return agreed
