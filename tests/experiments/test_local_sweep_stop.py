"""A ``launcher=local_submitit`` sweep owns its jobs: stopping the sweep or any job stops every
job at a step boundary with a checkpoint, leaves no process, and names each job's state."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from train_helpers import job_dirs, summary, user_env

STEPS = 300  # far more than the seconds the test waits: the jobs must be stopped
ARGS = [
    "-m",
    "launcher=local_submitit",
    "model=bert-tiny-cls",
    "data.num_train=64",
    "data.num_val=32",
    "data.batch_size=8",
    "trainer.log_every_n_steps=1",
    f"trainer.max_steps={STEPS}",
    "trainer.checkpoint_every_n_steps=1000",
    "optimizer.lr=1e-4,2e-4",
]


def _tasks(sweep: psutil.Process) -> list[psutil.Process]:
    return [
        p
        for p in sweep.children(recursive=True)
        if "submitit.core._submit" in " ".join(p.cmdline())
    ]


def _alive(pids: list[int]) -> list[str]:
    left = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{pid} {' '.join(proc.cmdline())[:100]}")
        except psutil.NoSuchProcess:
            pass
    return left


@pytest.mark.process
def test_sigterm_to_one_job_stops_every_job_with_a_checkpoint_and_leaves_no_process(tmp_path):
    env = {**user_env(), "KILN_LOG_DIR": str(tmp_path), "WANDB_MODE": "offline"}
    out = tmp_path / "sweep.log"
    with out.open("w") as f:
        sweep = subprocess.Popen(
            [sys.executable, "-m", "kiln.experiments.train", *ARGS],
            env=env, cwd=tmp_path, stdout=f, stderr=f, start_new_session=True,
        )  # fmt: skip
    tree: list[int] = [sweep.pid]
    try:
        deadline = time.monotonic() + 300
        logs = lambda: sorted(tmp_path.glob("multirun/*/.submitit/*/*_log.out"))  # noqa: E731
        while len(logs()) < 2 or not all("step 2/" in p.read_text() for p in logs()):
            assert sweep.poll() is None, out.read_text()[-4000:]
            assert time.monotonic() < deadline, "the jobs did not reach step 2 in 300 s"
            time.sleep(0.1)
        parent = psutil.Process(sweep.pid)
        tree += [p.pid for p in parent.children(recursive=True)]
        tasks = _tasks(parent)
        assert len(tasks) == 2, tasks
        tasks[0].send_signal(signal.SIGTERM)  # one job is stopped: the sweep stops them all
        returncode = sweep.wait(timeout=300)
        time.sleep(1)
        left = _alive(tree)
    finally:
        for pid in tree[::-1]:  # whatever the code under test left: the machine is shared
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
    text = out.read_text()
    assert returncode == 1, text[-4000:]
    assert left == [], left
    assert "Traceback" not in text and "UncompletedJobError" not in text, text[-4000:]
    for job_dir in job_dirs(tmp_path):
        record = summary(job_dir)
        assert (record["status"], record["stop_signal"]) == ("stopped", "SIGTERM"), job_dir
        assert 2 <= record["global_step"] < STEPS and record["checkpoint"], record
        assert (job_dir / record["checkpoint"]).exists()
        line = f"job #{job_dir.name} optimizer.lr="
        assert f"stopped by SIGTERM at step {record['global_step']} with a checkpoint" in next(
            (ln for ln in text.splitlines() if ln.startswith(line)), ""
        ), text[-4000:]


class _Job:
    """A stand-in for submitit's ``LocalJob``: a real process in its own session, which ends
    on SIGTERM (as a controller does once its task stopped), with or without a result."""

    def __init__(self, folder: Path, name: str, result: bool) -> None:
        script = (
            "import signal, sys, time, pathlib\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
            f"if {result}: pathlib.Path({str(folder / name)!r}).write_text('x')\n"
            "time.sleep(120)\n"
        )
        self._process = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
        self.paths = type("Paths", (), {"result_pickle": folder / name})()

    def done(self) -> bool:
        return self._process.poll() is not None

    def results(self) -> list[str]:
        return ["result"]


def test_sigterm_to_the_sweep_stops_every_job_and_names_each_state(tmp_path, capsys):
    from kiln.experiments.launchers.local import SweepStopped, wait_for_jobs

    jobs = [_Job(tmp_path, str(i), result=False) for i in range(2)]
    timer = threading.Timer(1.0, lambda: signal.raise_signal(signal.SIGTERM))
    timer.start()
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SweepStopped) as stopped:
        wait_for_jobs(jobs, ["#0 a=1", "#1 a=2"], [tmp_path / "0", tmp_path / "1"])
    timer.join()
    assert stopped.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before  # the sweep's handler is put back
    assert all(job._process.poll() is not None for job in jobs)
    err = capsys.readouterr().err
    assert "sweep stopped (the sweep got SIGTERM)" in err, err
    assert "job #0 a=1: ended before kiln recorded it" in err
    assert "job #1 a=2: ended before kiln recorded it" in err
