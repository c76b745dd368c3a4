"""Imports go one way: between the packages (experiments -> models -> core) and, inside each
package, between its rooms (a folder, or a module beside them): no room imports one that
imports it back, directly or around a circle. Every import counts, at module level, inside a
function or for type checking only; a package's own ``__init__`` (its public API) is left out."""

from __future__ import annotations

import ast
import itertools
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).parent.parent / "packages"
PACKAGES = ("core", "models", "experiments")


def imports(path: Path) -> list[tuple[str, int]]:
    """Every ``kiln.`` module ``path`` imports (``from kiln.x import y``: ``kiln.x.y`` as
    well, as ``y`` may be a module), with its line."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.startswith("kiln.")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kiln."):
            found += [(f"{node.module}.{a.name}", node.lineno) for a in node.names]
    return found


def room(package: str, module: str) -> str | None:
    """The room of ``kiln.<package>`` that ``module`` lives in (``None``: another package)."""
    parts = module.split(".")
    if parts[:2] != ["kiln", package] or len(parts) < 3:
        return None
    return parts[2]


def edges(package: str) -> dict[str, dict[str, list[str]]]:
    """room -> imported room -> the import lines that make the edge."""
    root = SRC / package / "src" / "kiln" / package
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if relative == Path("__init__.py"):
            continue
        source = relative.parts[0].removesuffix(".py")
        for module, line in imports(path):
            target = room(package, module)
            if target is not None and target != source:
                graph[source][target].append(f"{relative}:{line} imports {module}")
    return graph


def cycle(graph: dict[str, dict[str, list[str]]]) -> list[str] | None:
    """One circle of rooms, or ``None``."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, {})):
            if state.get(target) == "open":
                return [*stack[stack.index(target) :], target]
            if target not in state and (found := visit(target)) is not None:
                return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


@pytest.mark.parametrize("package", PACKAGES)
def test_no_room_of_a_package_imports_one_that_imports_it_back(package) -> None:
    graph = edges(package)
    found = cycle(graph)
    if found is not None:
        lines = [line for a, b in itertools.pairwise(found) for line in graph[a][b]]
        pytest.fail(f"kiln.{package}: {' -> '.join(found)}\n" + "\n".join(lines))


@pytest.mark.parametrize(
    ("package", "above"), [("core", ("models", "experiments")), ("models", ("experiments",))]
)
def test_a_package_imports_none_above_it(package, above) -> None:
    root = SRC / package / "src" / "kiln" / package
    wrong = [
        f"{path.relative_to(root)}:{line} imports {module}"
        for path in sorted(root.rglob("*.py"))
        for module, line in imports(path)
        if module.split(".")[1] in above
    ]
    assert not wrong, "\n".join(wrong)


def test_a_circle_is_found_and_named() -> None:
    """The check itself: a circle of three rooms is found, a chain is not."""
    chain = {"a": {"b": ["x"]}, "b": {"c": ["y"]}}
    assert cycle(chain) is None
    assert cycle({**chain, "c": {"a": ["z"]}}) == ["a", "b", "c", "a"]


def core_import_problem(module: str) -> str | None:
    """Why another package may not import ``module`` (``kiln.core...`` as :func:`imports`
    names it), or ``None``: kiln.core's public names (``kiln.core.__all__``) come from
    ``kiln.core``, anything else from the module that defines it (or a package's
    ``__all__``), and nothing private (``_name``) from anywhere."""
    import importlib

    import kiln.core

    parent, _, name = module.rpartition(".")
    if any(part.startswith("_") for part in module.split(".")[2:]):
        return "a private name"
    if _is_module(module):
        return None  # a module: its names are checked where they are imported
    if parent == "kiln.core":
        return None if name in kiln.core.__all__ else "not in kiln.core.__all__"
    if name in kiln.core.__all__:
        return "public: import it from kiln.core"
    home = importlib.import_module(parent)
    if not hasattr(home, name):
        return f"{parent} has no {name}"
    if name in getattr(home, "__all__", ()):
        return None
    defined_in = getattr(getattr(home, name), "__module__", parent)
    if not isinstance(defined_in, str) or defined_in == parent:
        return None
    return f"defined in {defined_in}"


def _is_module(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def test_the_other_packages_use_kiln_core_public_names_or_their_modules() -> None:
    """kiln.models and kiln.experiments import kiln.core's public names from ``kiln.core``
    and anything else from the module that defines it, never a private name."""
    wrong = []
    for package in ("models", "experiments"):
        root = SRC / package / "src"
        for path in sorted(root.rglob("*.py")):
            for module, line in imports(path):
                if module.startswith("kiln.core.") and (why := core_import_problem(module)):
                    wrong.append(f"{path.relative_to(root)}:{line} imports {module}: {why}")
    assert not wrong, "kiln.core imported past its API:\n" + "\n".join(wrong)


@pytest.mark.parametrize(
    ("module", "why"),
    [
        ("kiln.core.fit", None),
        ("kiln.core.callbacks", None),
        ("kiln.core.telemetry.machine.describe_machine", None),
        ("kiln.core.callbacks.EMA", None),
        ("kiln.core.describe_machine", "not in kiln.core.__all__"),
        ("kiln.core.config.TrainerConfig", "public: import it from kiln.core"),
        ("kiln.core.loop.step._window_total", "a private name"),
        ("kiln.core.telemetry.machine.Calibration", "defined in kiln.core.telemetry.records"),
    ],
)
def test_the_rule_names_each_import_past_the_api(module, why) -> None:
    assert core_import_problem(module) == why


def test_kiln_core_public_surface_is_small_and_imports() -> None:
    """``kiln.core.__all__`` is what a user of ``fit`` needs (at most 25 names); each name
    imports, and the config classes import without Fabric."""
    import importlib
    import subprocess
    import sys

    core = importlib.import_module("kiln.core")
    assert len(core.__all__) <= 25, sorted(core.__all__)
    missing = [name for name in core.__all__ if getattr(core, name, None) is None]
    assert not missing, missing
    probe = (
        "import sys; from kiln.core import TrainerConfig, CompileConfig, ProfileConfig; "
        "print(sorted({'torch', 'lightning'} & {m.split('.')[0] for m in sys.modules}))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
