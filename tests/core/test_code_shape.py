"""Every function of every package reads in one sitting: ruff's complexity rules (C901:
branches, PLR0915: statements) are on in the project's config and hold in every module below
``packages/``, subpackages (``kiln/core/callbacks/``) included."""

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUFF = [sys.executable, "-m", "ruff"]
RULES = ("C901", "PLR0915")


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*RUFF, "check", "--config", str(ROOT / "pyproject.toml"), "--select", ",".join(RULES),
         "--output-format", "concise", "--no-cache", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )  # fmt: skip


def test_the_complexity_rules_are_on_in_the_project_config():
    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert set(RULES) <= set(lint["select"])


def test_every_module_below_packages_passes_them():
    proc = ruff("packages")
    assert proc.returncode == 0, f"split these into named stages:\n{proc.stdout}"


def test_they_reach_a_module_in_a_nested_package(tmp_path):
    nested = tmp_path / "kiln" / "core" / "callbacks" / "deep"
    nested.mkdir(parents=True)
    branches = "\n".join(f"    if x == {i}:\n        return {i}" for i in range(12))
    (nested / "tangle.py").write_text(f"def tangle(x):\n{branches}\n    return -1\n")
    proc = ruff(str(tmp_path))
    assert proc.returncode == 1 and "C901 `tangle` is too complex" in proc.stdout, proc.stdout
