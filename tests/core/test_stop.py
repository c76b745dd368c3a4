"""A signal inside ``stop_on_signals`` stops ``fit`` at the next step boundary with a checkpoint
there (however rare the periodic ones), on every rank alike, and the run resumes exactly."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_resume import EPOCHS_KW, assert_same_weights, epochs_trainer, losses
from toy import ToyTokenModule, weights

from kiln.core import fit, launch
from kiln.core.distributed import stop
from kiln.core.distributed.stop import StopPoll, stop_on_signals

STOP_AT = 9  # epoch 1 (7 steps per epoch), between the periodic checkpoints (every 1000)


class SignalAt:
    """Sends ``signum`` to this process during step ``step`` (on ``rank`` only)."""

    def __init__(self, signum: int, step: int, rank: int = 0) -> None:
        self.signum, self.step, self.rank, self.loop = signum, step, rank, None

    def on_loop_start(self, loop) -> None:
        self.loop = loop

    def on_before_optimizer_step(self, optimizer) -> None:
        loop = self.loop
        if loop.fabric.global_rank == self.rank and loop.global_step + 1 == self.step:
            os.kill(os.getpid(), self.signum)


def run(root: Path, resume: str | None, signum: int | None, devices: int = 1, rank: int = 0):
    """The epochs toy of test_resume, checkpointing every 1000 steps, inside stop_on_signals
    (with ``signum`` sent to ``rank`` during step ``STOP_AT``); top-level for spawned ranks."""
    trainer = epochs_trainer(root, resume, devices)
    trainer.checkpoint_every_n_steps = 1000
    module = ToyTokenModule(**EPOCHS_KW)
    callbacks = [SignalAt(signum, STOP_AT, rank)] if signum else []
    with stop_on_signals():
        result = fit(module, trainer, callbacks=callbacks)
    return {"weights": weights(module), "result": result}


def _assert_stopped_then_resumed_exactly(root: Path, stopped, resumed, full) -> None:
    assert (stopped.stop_reason, stopped.global_step) == ("signal", STOP_AT)
    assert stopped.checkpoint == str(root / "ckpt" / f"step-{STOP_AT:08d}.ckpt")
    assert resumed["result"].stop_reason == "max_steps"
    assert_same_weights(resumed["weights"], full["weights"])
    assert losses(resumed["result"]) == losses(full["result"])
    assert resumed["result"].metrics == full["result"].metrics


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> dict:
    """The run uninterrupted, shared by the stops below."""
    return run(tmp_path_factory.mktemp("full"), None, None)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_at_the_step_boundary_with_a_checkpoint(tmp_path, full, signum) -> None:
    before = signal.getsignal(signum)
    stopped = run(tmp_path / "stopped", None, signum)["result"]
    assert stopped.stop_signal == signal.Signals(signum).name
    assert signal.getsignal(signum) is before  # the previous handler is back
    resumed = run(tmp_path / "stopped", "auto", None)
    _assert_stopped_then_resumed_exactly(tmp_path / "stopped", stopped, resumed, full)


def test_a_signal_outside_the_step_loop_goes_to_the_previous_handler() -> None:
    # Python's own SIGINT handler, as kiln-train has it (a test run before may have left another)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    previous_usr2 = signal.getsignal(signal.SIGUSR2)
    try:
        with pytest.raises(KeyboardInterrupt), stop_on_signals():
            os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        received: list[int] = []
        signal.signal(signal.SIGUSR2, lambda signum, _frame: received.append(signum))
        with stop_on_signals():
            os.kill(os.getpid(), signal.SIGUSR2)
        assert received == [signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGUSR2, previous_usr2)


def test_a_slurm_job_drops_any_stop_signal_while_it_stops_then_hands_the_stop_over() -> None:
    """A SLURM job (``ignore_repeated_signals(any_signal=True)``): while the loop stops for
    USR2, another USR2 (``scancel --full`` delivers it twice) and a SIGTERM are dropped rather
    than passed to the previous handler (submitit's requeue, kiln-train's exit); once the
    checkpoint is written, ``hand_over`` gives the previous handler the stop, once."""
    received: list[int] = []

    def record(signum: int, _frame) -> None:
        received.append(signum)

    previous = {s: signal.signal(s, record) for s in (signal.SIGTERM, signal.SIGUSR2)}
    request = stop._REQUEST
    ignored = (request.repeats_ignored, request.others_ignored)
    try:
        with stop_on_signals(), stop.listening():
            os.kill(os.getpid(), signal.SIGUSR2)
            assert stop.requested_signal() == signal.SIGUSR2
            os.kill(os.getpid(), signal.SIGTERM)  # a plain process: the second signal acts
            assert received == [signal.SIGTERM]
            stop.ignore_repeated_signals(any_signal=True)
            for signum in (signal.SIGUSR2, signal.SIGTERM):
                os.kill(os.getpid(), signum)
            assert received == [signal.SIGTERM]  # dropped: the stop under way goes on
        assert stop.requested_signal() == signal.SIGUSR2
        stop.hand_over(signal.SIGUSR2)
        assert received == [signal.SIGTERM, signal.SIGUSR2]
        assert stop.requested_signal() == 0
    finally:
        request.repeats_ignored, request.others_ignored = ignored
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@pytest.mark.slow  # three 2-process launches: minutes each on the loaded 2-core VM (seen passing)
def test_a_signal_on_one_of_two_ranks_stops_both_at_the_same_step(tmp_path) -> None:
    full = launch(run, 2, tmp_path / "full", None, None, 2)
    stopped = launch(run, 2, tmp_path / "stopped", None, signal.SIGTERM, 2, 1)
    for rank in range(2):  # rank 0 never got the signal: the all-reduce told it
        assert stopped[rank]["result"].stop_signal == "SIGTERM"
    resumed = launch(run, 2, tmp_path / "stopped", "auto", None, 2)
    for rank in range(2):
        _assert_stopped_then_resumed_exactly(
            tmp_path / "stopped", stopped[rank]["result"], resumed[rank], full[rank]
        )


def poll_while_a_signal_comes(signum: int) -> list[int]:
    """Two :class:`StopPoll` calls on each of two gloo ranks; ``signum`` reaches rank 0 while
    its first poll waits in the all-reduce for rank 1 (late by 1.5 s), as a parent-death
    signal does on a loaded machine. Top-level for spawned ranks: what each poll answered."""
    torch.distributed.init_process_group("gloo")
    try:
        with stop_on_signals([signum]), stop.listening():
            poll = StopPoll(SimpleNamespace(world_size=2))
            if torch.distributed.get_rank() == 0:
                threading.Timer(0.3, os.kill, (os.getpid(), signum)).start()
            else:
                time.sleep(1.5)
            return [poll(), poll()]
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.process
def test_a_signal_that_comes_while_the_ranks_reduce_stops_both_at_the_next_poll() -> None:
    """The request a signal makes while its rank waits in a poll's all-reduce (its 0 already
    sent) is not overwritten by that poll's answer: the next poll stops both ranks. Erased,
    the ranks trained on with their job killed, and ended without a checkpoint."""
    results = launch(poll_while_a_signal_comes, 2, int(signal.SIGUSR2))
    assert results[0] == results[1], results  # the ranks agree at every poll
    assert results[0][-1] == signal.SIGUSR2, results
