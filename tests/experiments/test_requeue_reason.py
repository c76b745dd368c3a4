"""A requeued attempt's reason names the signal that stopped it: SLURM's USR2 (time limit,
``scancel --signal``) or the SIGTERM of its preemption, which requeues the same way."""

from __future__ import annotations

import signal

import pytest

from kiln.experiments.jobs.lifecycle import Requeued, one_line_reason
from kiln.experiments.train.train_job import end_after_signal


def test_usr2_at_a_step_boundary_requeues_and_says_so() -> None:
    before = signal.signal(signal.SIGUSR2, lambda *_: None)  # as fit's stop handler is
    try:
        with pytest.raises(Requeued) as caught:
            end_after_signal("SIGUSR2", {"status": "ok"})
    finally:
        signal.signal(signal.SIGUSR2, before)
    assert one_line_reason(caught.value) == (
        "Requeued: stopped by SIGUSR2 at a step boundary with a checkpoint; requeued by submitit"
    )


def test_a_preemption_sigterm_requeue_names_sigterm() -> None:
    assert str(Requeued({}, "SIGTERM")).startswith("stopped by SIGTERM at a step boundary")


def test_submitits_requeue_exit_while_the_job_starts_is_a_requeued_attempt(monkeypatch) -> None:
    """USR2 before kiln's loop (the config or setup stage): submitit's handler requeues the
    job and exits (``SystemExit(-1)``); the attempt is ``requeued``, not failed."""
    from kiln.experiments.launchers import slurm
    from kiln.experiments.train.train_job import _attempt_end

    assert _attempt_end(SystemExit(-1), {"status": "failed"}) == "failed"  # not submitit's
    monkeypatch.setattr(slurm, "_requeue_started", [True])
    assert _attempt_end(SystemExit(-1), {"status": "failed"}) == "requeued"
    assert _attempt_end(SystemExit(1), {"status": "failed"}) == "failed"
