import io
import re

import pytest
from rich.console import Console

from kiln.core.telemetry.progress import Progress


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=120), out


def test_plain_lines_when_not_a_terminal():
    console, out = _console(terminal=False)
    with Progress(100, enabled=True, start_step=0, console=console) as progress:
        assert not progress.is_terminal
        for step in range(1, 11):
            logged = step % 5 == 0
            progress.update(step, 0.42134 if logged else None, 512.34 if logged else None)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2  # only the steps that brought a loss
    assert re.fullmatch(r"step 5/100 loss 0\.4213 samples/s 512\.3 eta \d+:\d\d:\d\d", lines[0])
    assert lines[1].startswith("step 10/100 loss 0.4213")
    assert "\x1b[" not in out.getvalue()  # no terminal escape codes in logs


def test_plain_mode_prints_the_last_step_and_unknowns():
    console, out = _console(terminal=False)
    with Progress(3, enabled=True, start_step=1, console=console) as progress:
        progress.update(2, None, None)
        progress.update(3, None, None)
    assert out.getvalue() == "step 3/3 loss - samples/s - eta 0:00:00\n"


def test_rich_bar_in_a_terminal():
    console, out = _console(terminal=True)
    with Progress(10, enabled=True, console=console) as progress:
        assert progress.is_terminal
        for step in range(1, 11):
            progress.update(step, 1.5 if step == 10 else None, 99.0 if step == 10 else None)
    text = out.getvalue()
    assert "\x1b[" in text  # drawn with terminal control codes
    assert "10/10" in text
    assert "loss 1.5000" in text
    assert "samples/s 99.0" in text
    assert "step 10/10 loss" not in text  # no plain log lines


def test_disabled_prints_nothing(capsys):
    with Progress(10, enabled=False) as progress:
        progress.update(1, 0.5, 10.0)
    assert capsys.readouterr().out == ""


def test_bad_arguments():
    with pytest.raises(ValueError, match="start_step=11"):
        Progress(10, enabled=True, start_step=11)
    console, _ = _console(terminal=False)
    with pytest.raises(RuntimeError, match="outside its `with` block"):
        Progress(10, enabled=True, console=console).update(1, 0.1, None)
