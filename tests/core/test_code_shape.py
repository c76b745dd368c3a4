"""kiln.core stays readable: no function (or method) longer than 60 lines."""

import ast
from pathlib import Path

import kiln.core

MAX_LINES = 60
CORE = Path(kiln.core.__file__).parent


def function_lengths() -> dict[str, int]:
    """``file:name`` -> lines from ``def`` to the last line, docstring included."""
    lengths = {}
    for path in sorted(CORE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lengths[f"{path.name}:{node.name}"] = node.end_lineno - node.lineno + 1
    return lengths


def test_no_function_in_kiln_core_is_longer_than_60_lines():
    lengths = function_lengths()
    assert "loop.py:fit" in lengths  # the walk found the package
    too_long = {name: n for name, n in lengths.items() if n > MAX_LINES}
    assert not too_long, f"split these into named stages: {too_long}"


if __name__ == "__main__":  # print the longest ones
    for name, n in sorted(function_lengths().items(), key=lambda kv: -kv[1])[:8]:
        print(f"{n:4d}  {name}")
