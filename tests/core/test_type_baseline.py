"""kiln.core type-checks strict with nothing frozen: basedpyright is strict on the package,
and its baseline (the errors ``make lint`` tolerates) lists no kiln.core file, so a
``--writebaseline`` cannot quietly accept a new kiln.core error."""

import json
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = "packages/core/src/kiln/core"


def test_basedpyright_is_strict_on_kiln_core():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["basedpyright"]
    assert CORE in config["strict"]
    assert "packages/core/src" in config["include"]


def test_the_baseline_holds_no_kiln_core_error():
    baseline = json.loads((ROOT / ".basedpyright" / "baseline.json").read_text())
    frozen = {path: len(errors) for path, errors in baseline["files"].items() if CORE in path}
    assert frozen == {}, f"kiln.core errors frozen in the baseline (fix them instead): {frozen}"
