"""kiln's lines in a SLURM batch script (``kiln.experiments.launchers.slurm_batch``), run by
bash with stand-ins for ``srun`` and ``scancel``: the shell survives USR2 and TERM, keeps a
USR2 that came before the job step in the signal file, and passes later ones to the step."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kiln.experiments.launchers.slurm_batch import batch_setup, task_command

pytestmark = pytest.mark.process

FAKE_SRUN = """#!/bin/sh
echo "$KILN_SLURM_SIGNAL_FILE" > "$D/srun_env"
touch "$D/srun_started"
while [ ! -e "$D/stop" ]; do sleep 0.05; done
exit 7
"""
FAKE_SCANCEL = """#!/bin/sh
echo "$*" >> "$D/scancel"
"""


def _wait_for(path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert proc.poll() is None, f"the batch shell ended ({proc.returncode})"
        assert time.monotonic() < deadline, f"no {path.name}"
        time.sleep(0.02)


def _signal(proc: subprocess.Popen, signum: int, tmp_path: Path, calls: int) -> None:
    """Send ``signum`` to the shell and wait until its trap ran (the shell writes its note)."""
    os.kill(proc.pid, signum)
    deadline = time.monotonic() + 30
    while (tmp_path / "shell.err").read_text().count("kiln: the batch shell got") < calls:
        assert proc.poll() is None, f"the batch shell died of {signum}"
        assert time.monotonic() < deadline, "the trap did not run"
        time.sleep(0.02)


def test_the_batch_shell_keeps_a_signal_before_the_step_and_passes_later_ones_on(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scancel", FAKE_SCANCEL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    folder = tmp_path / "submitit" / "%j"
    (tmp_path / "submitit" / "42").mkdir(parents=True)
    script = [
        "#!/bin/bash",
        *batch_setup(str(folder)),
        'touch "$D/in_setup"',  # the user's setup lines: no step yet
        'while [ ! -e "$D/go" ]; do sleep 0.05; done',
        "srun --unbuffered python -u -m job",  # submitit's line, as it writes it
        'echo "rc=$?" > "$D/rc"',
    ]
    (tmp_path / "batch.sh").write_text("\n".join(script) + "\n")
    env = {**os.environ, "D": str(tmp_path), "SLURM_JOB_ID": "42"}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    with (tmp_path / "shell.err").open("w") as err:
        proc = subprocess.Popen(["bash", str(tmp_path / "batch.sh")], env=env, stderr=err)
    try:
        _wait_for(tmp_path / "in_setup", proc)
        _signal(proc, signal.SIGUSR2, tmp_path, 1)
        kept = tmp_path / "submitit" / "42" / "42_kiln_signal"
        assert kept.read_text().split() == ["USR2"]
        assert not (tmp_path / "scancel").exists()  # no step to signal yet
        (tmp_path / "go").touch()
        _wait_for(tmp_path / "srun_started", proc)
        assert (tmp_path / "srun_env").read_text().strip() == str(kept)
        _signal(proc, signal.SIGUSR2, tmp_path, 2)
        _wait_for(tmp_path / "scancel", proc)  # passed on in the background
        _signal(proc, signal.SIGTERM, tmp_path, 3)
        deadline = time.monotonic() + 30
        while len((tmp_path / "scancel").read_text().splitlines()) < 2:
            assert time.monotonic() < deadline, "SIGTERM was not passed on"
            time.sleep(0.02)
        assert (tmp_path / "scancel").read_text().splitlines() == [
            "--signal=USR2 42",
            "--signal=TERM 42",
        ]
        (tmp_path / "stop").touch()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert (tmp_path / "rc").read_text().strip() == "rc=7"  # the step's own exit status
    notes = (tmp_path / "shell.err").read_text()
    assert "got SIGUSR2 before the job step: kept for it" in notes, notes
    assert "got SIGTERM: passed to the job step" in notes, notes


def test_a_task_started_by_srun_survives_usr2_and_term_before_python_handles_them(tmp_path):
    """The interpreter starts with USR2 and TERM ignored: one that comes before kiln's first
    line (start_job) does not kill the task (the batch shell's file keeps a USR2 for it)."""
    argv = shlex.split(task_command(sys.executable))
    assert argv[-3:] == ["-u", "-m", "kiln.experiments.launchers.slurm"]
    code = "import time; time.sleep(1.5); print('alive')"
    proc = subprocess.Popen([*argv[:-3], "-c", code], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    for signum in (signal.SIGUSR2, signal.SIGTERM):
        proc.send_signal(signum)
    out, _ = proc.communicate(timeout=30)
    assert (proc.returncode, out.strip()) == (0, "alive")
