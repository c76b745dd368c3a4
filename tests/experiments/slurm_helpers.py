"""Helpers for the ``slurm`` tests: submit kiln-train to the local cluster, read its tasks."""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path


def task_folder(job_dir: Path) -> Path:
    """submitit's folder of one Hydra job's SLURM job: ``<array job id>_<array index>``, or
    ``<job id>`` when the sweep is a single job (no array)."""
    folders = list((job_dir.parent / ".submitit").iterdir())
    tasks = [d for d in folders if d.name.endswith(f"_{job_dir.name}")]
    if not tasks and job_dir.name == "0":  # a one-job sweep is no array: <job id>
        tasks = [d for d in folders if d.name.isdigit()]
    assert len(tasks) == 1, folders
    return tasks[0]


def task_logs(job_dir: Path) -> dict[int, str]:
    """Each SLURM task's submitit log (stdout and stderr) for one Hydra job, by global rank."""
    logs: dict[int, str] = {}
    for out in sorted(task_folder(job_dir).glob("*_log.out")):
        rank = int(out.name.split("_")[-2])  # <job>[_<index>]_<rank>_log.out
        logs[rank] = out.read_text() + out.with_name(out.name[: -len("out")] + "err").read_text()
    return logs


def task_results(job_dir: Path) -> list[str]:
    """Each SLURM task's submitit outcome (``success`` or ``error``) for one Hydra job, by rank."""
    paths = task_folder(job_dir).glob("*_result.pkl")
    outcomes = []
    for path in sorted(paths, key=lambda p: int(p.name.split("_")[-2])):
        with path.open("rb") as f:
            outcomes.append(pickle.load(f)[0])
    return outcomes


def wait_for_log(sweep: subprocess.Popen, sweep_dir: Path, text: str) -> str:
    """Wait until the job's rank-0 task log shows ``text``; returns the SLURM job id."""
    deadline = time.monotonic() + 900
    while True:
        assert sweep.poll() is None and time.monotonic() < deadline, f"no {text!r} in time"
        logs = list(sweep_dir.glob(".submitit/*/*_0_log.out"))  # rank 0
        if logs and text in logs[0].read_text():
            return logs[0].parent.name
        time.sleep(0.05)


def job_field(job_id: str, name: str) -> str:
    """One field of ``scontrol show job`` (``Restarts``, ``JobState``)."""
    cmd = ["scontrol", "show", "job", "--oneliner", job_id]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
    fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
    return fields.get(name, "")


def wait_for_end(job_id: str) -> str:
    """Wait until SLURM has ended the job (it may still be COMPLETING once its tasks left
    their results); returns its state."""
    from kiln.experiments.launchers.slurm import ENDED_STATES

    deadline = time.monotonic() + 120
    while (state := job_field(job_id, "JobState")) not in ENDED_STATES:
        assert time.monotonic() < deadline, f"job {job_id} still {state}"
        time.sleep(0.5)
    return state


def wait_for_restarts(sweep: subprocess.Popen, job_id: str, restarts: int) -> None:
    """Wait until SLURM has requeued the job ``restarts`` times."""
    deadline = time.monotonic() + 600
    while job_field(job_id, "Restarts") != str(restarts):
        assert sweep.poll() is None and time.monotonic() < deadline, f"not requeued {restarts}x"
        time.sleep(0.5)


def wait_for_file(sweep: subprocess.Popen, path: Path) -> None:
    """Wait until ``path`` exists (``end_signal_hook``'s marker: the job holds there)."""
    deadline = time.monotonic() + 900
    while not path.exists():
        assert sweep.poll() is None and time.monotonic() < deadline, f"no {path.name} in time"
        time.sleep(0.05)


def hold_env(variable: str, marker: Path) -> dict[str, str]:
    """The environment that has ``end_signal_hook`` (loaded by ``plugins=[end_signal_hook]``)
    hold the job at ``variable``'s instant, touching ``marker`` there."""
    from end_signal_hook import HOOK

    path = os.pathsep.join(p for p in (HOOK[1], os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, variable: str(marker)}


def wait_for_step(sweep: subprocess.Popen, sweep_dir: Path, step: int) -> str:
    """Wait until the job's task log shows ``step``; returns the SLURM job id."""
    return wait_for_log(sweep, sweep_dir, f"step {step}/")


def task_pids(sweep_dir: Path, count: int) -> list[int]:
    """The job's ``count`` task processes (submitit's entry with this sweep's folder), on every
    node (the nodes' namespaces share this machine's ``/proc``)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        task = b"submitit.core._submit" in cmdline and not cmdline[0].endswith(b"srun")
        if task and str(sweep_dir).encode() in cmdline[-2]:
            pids.append(int(proc.name))
    assert len(pids) == count, pids
    return pids


def _pending(pid: int, signum: int) -> bool:
    """Whether ``signum`` waits in process ``pid`` (sent to it or to one of its threads)."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    masks = [int(line.split()[1], 16) for line in lines if line.startswith(("ShdPnd", "SigPnd"))]
    return any(mask >> (signum - 1) & 1 for mask in masks)


def signal_at_step(
    sweep: subprocess.Popen, sweep_dir: Path, step: int, tasks: int, how: tuple[str, ...] = ()
) -> str:
    """``scancel --signal=USR2 <how>`` to the job once its rank-0 log shows ``step``, received
    mid-run: the job's ``tasks`` processes are held (SIGSTOP) until the signal waits in each of
    them, then go on (SIGCONT). A tiny job's step takes about 10 ms, less than scancel's trip
    through slurmctld and slurmd: unheld, the job could end before the signal came (CI saw
    it once). Returns the SLURM job id."""
    job_id = wait_for_step(sweep, sweep_dir, step)
    pids = task_pids(sweep_dir, tasks)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        subprocess.run(["scancel", "--signal=USR2", *how, job_id], check=True, timeout=60)
        deadline = time.monotonic() + 120
        while not all(_pending(pid, signal.SIGUSR2) for pid in pids):
            assert time.monotonic() < deadline, f"USR2 never reached the tasks {pids}"
            time.sleep(0.05)
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    return job_id


def start_sweep(
    tmp_path: Path, args: list[str], partition: str = "debug", env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, Path]:
    """``kiln-train -m launcher=slurm <args>`` in the background (its output in sweep.log;
    ``env``: extra environment variables, which its SLURM jobs get too)."""
    slurm = ["-m", "launcher=slurm", f"hydra.launcher.partition={partition}", *args]
    sweep_dir = tmp_path / "slurm"
    env = {**os.environ, **(env or {}), "KILN_LOG_DIR": str(tmp_path), "WANDB_MODE": "offline"}
    cmd = [sys.executable, "-m", "kiln.experiments.train", *slurm, f"hydra.sweep.dir={sweep_dir}"]
    log = (tmp_path / "sweep.log").open("w")
    sweep = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    return sweep, sweep_dir


def end(sweep: subprocess.Popen, timeout: float) -> None:
    """Wait for the sweep (killed, with its SLURM jobs left alone, when it overruns)."""
    try:
        sweep.wait(timeout=timeout)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
