"""How kiln's commands end: an interrupted one dies by SIGINT after its exit handlers ran."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

INTERRUPTED = """
import atexit, sys
import torch._dynamo  # its exit handler imports tabulate, which runs code from strings
from kiln.experiments.jobs.fast_exit import end_interrupted

atexit.register(lambda: open(sys.argv[1], "w").write("ran"))
exec("x = 1")  # code from a string before the interrupt, as namedtuples and dataclasses run
try:
    raise KeyboardInterrupt
except KeyboardInterrupt as interrupt:
    end_interrupted(interrupt)
"""


def test_an_interrupted_command_dies_by_sigint_after_its_exit_handlers(tmp_path: Path) -> None:
    """A launcher (torch's agent, srun, a shell) reads an interrupt from the signal that ended
    the process; the exit handlers (W&B's teardown among them) still run first."""
    marker = tmp_path / "atexit"
    script = tmp_path / "interrupted.py"
    script.write_text(textwrap.dedent(INTERRUPTED))
    proc = subprocess.run(
        [sys.executable, str(script), str(marker)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == -signal.SIGINT, proc.stderr
    assert marker.read_text() == "ran"
    assert "KeyboardInterrupt" in proc.stderr  # the traceback, as the interpreter prints it


STOPPED_COMMAND = """
import sys
import torch._dynamo  # as a loaded model brings it: its exit handler imports tabulate
import kiln.experiments.{name}.cli as cli

def stopped(*args, **kwargs):
    raise KeyboardInterrupt  # Ctrl-C while the command works

cli.{work} = stopped
cli.main(sys.argv[1:])
"""


@pytest.mark.parametrize(
    ("name", "work", "args"),
    [("eval", "run_eval", ["checkpoint"]), ("export", "export", ["checkpoint", "out"])],
)
def test_kiln_eval_and_export_die_by_sigint_when_interrupted(
    name: str, work: str, args: list[str]
) -> None:
    """Without their own ending, both exit 1 (the interpreter loses the interrupt)."""
    code = textwrap.dedent(STOPPED_COMMAND).format(name=name, work=work)
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == -signal.SIGINT, proc.stderr
