"""``scripts/gpu_check.sh``: its parts, its refusal of an unknown one, and the suite models its
``suites`` part names (a typo there would only show on the GPU machine, minutes into a lent
session)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kiln.experiments.settings.suite_lists import list_batch_sizes

SCRIPT = Path(__file__).parents[2] / "scripts" / "gpu_check.sh"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_an_unknown_part_is_refused_naming_the_valid_ones():
    proc = _run("suite")
    assert proc.returncode == 2
    assert "unknown part 'suite'; use core, suites or all" in proc.stdout


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU machine runs it")
@pytest.mark.parametrize("part", ["core", "suites", "all"])
def test_without_a_gpu_every_part_says_so_and_exits_zero(part):
    proc = _run(part)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no CUDA GPU here" in proc.stdout


def _names(variable: str) -> list[str]:
    """The comma-separated models the script's ``variable`` (and its ``+=`` lines) hold."""
    text = SCRIPT.read_text()
    parts = re.findall(rf'{variable}\+?="([^"]*)"', text)
    return [name for part in parts for name in part.split(",") if name]


@pytest.mark.parametrize(("variable", "suite"), [("hf", "hf"), ("timm", "timm")])
def test_the_suites_part_runs_eight_models_of_each_list(variable, suite):
    names = _names(variable)
    assert len(names) == len(set(names)) == 8
    assert set(names) <= set(list_batch_sizes(suite)), set(names) - set(list_batch_sizes(suite))
    # the reduce-overhead rows are models the default rows also run
    ro = re.findall(rf"sweep=pt2_{suite} model\.arch=(\S+) \\$", SCRIPT.read_text(), re.M)
    assert ro and set(ro[0].split(",")) <= set(names)
