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


def test_the_other_packages_use_kiln_core_through_its_public_api() -> None:
    """kiln.models and kiln.experiments import kiln.core only through the names ``kiln.core``
    (or its public ``kiln.core.callbacks``) lists in ``__all__``: kiln.core's modules can move
    without breaking them."""
    import importlib

    wrong = []
    for package in ("models", "experiments"):
        root = SRC / package / "src"
        for path in sorted(root.rglob("*.py")):
            for module, line in imports(path):
                if not module.startswith("kiln.core."):
                    continue
                parent, _, name = module.rpartition(".")
                public = getattr(importlib.import_module(parent), "__all__", None)
                if parent.count(".") > 2 or public is None or name not in public:
                    wrong.append(f"{path.relative_to(root)}:{line} imports {module}")
    assert not wrong, "not kiln.core's public API:\n" + "\n".join(wrong)
