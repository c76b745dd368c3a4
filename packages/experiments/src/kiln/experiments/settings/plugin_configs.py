"""Config folders that come with installed kiln plugins, and the hint when a model has none.

A plugin package that ships ``<pkg>/configs/`` (``configs/model/<name>.yaml``...) next to
the module its ``kiln.plugins`` entry point names joins kiln's Hydra search path by
itself (``hydra_plugins.kiln_searchpath``), after kiln's own folder; one whose folder
lives elsewhere names it in a ``kiln.configs`` entry point (a package name, e.g.
``my_pkg.conf``). A folder that is not installed still joins with
``hydra.searchpath=[file:///path/to/configs]``.
"""

from __future__ import annotations

import importlib.util
import re
from importlib.metadata import entry_points
from pathlib import Path

CONFIGS_GROUP = "kiln.configs"
PLUGINS_GROUP = "kiln.plugins"  # kiln.models.plugins.ENTRY_POINT_GROUP, without importing it


def plugin_config_dirs() -> list[Path]:
    """The config folders of the installed plugins, in entry-point order, each once."""
    packages = [f"{ep.value.partition(':')[0].strip().split('.')[0]}.configs"
                for ep in entry_points(group=PLUGINS_GROUP)]  # fmt: skip
    packages += [ep.value.strip() for ep in entry_points(group=CONFIGS_GROUP)]
    found: list[Path] = []
    for package in packages:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):  # the plugin itself fails later, naming itself
            continue
        locations = list(spec.submodule_search_locations or []) if spec else []
        for location in locations[:1]:
            path = Path(location).resolve()
            if path.is_dir() and path not in found:
                found.append(path)
    return found


_MODEL_CHOICE = re.compile(r"^model=([\w.-]+)$")


def missing_model_hint(args: list[str], kiln_dir: str | Path) -> str | None:
    """What to tell a user whose ``model=<name>`` has no config anywhere kiln looks.

    Returns:
        ``None`` when the command names no single model, adds its own search path, or the
        config exists; else a message naming where kiln looked and how to add the folder.
    """
    names = [m.group(1) for arg in args if (m := _MODEL_CHOICE.match(arg))]
    if len(names) != 1 or any(
        arg.startswith(("hydra.searchpath", "+hydra.searchpath")) for arg in args
    ):
        return None
    name = names[0]
    folders = [Path(kiln_dir), *plugin_config_dirs()]
    if any((folder / "model" / f"{name}.yaml").is_file() for folder in folders):
        return None
    looked = ", ".join(str(folder) for folder in folders)
    return (
        f"kiln: no config model/{name}.yaml in kiln's configs or an installed plugin's "
        f"(looked in: {looked}). A plugin's configs join by themselves: ship "
        f"<pkg>/configs/model/{name}.yaml in the package that your "
        f'[project.entry-points."{PLUGINS_GROUP}"] entry point names (or name the folder\'s '
        f'package in [project.entry-points."{CONFIGS_GROUP}"]) and install it; a folder that '
        "is not installed joins with hydra.searchpath=[file:///path/to/configs]. See "
        "docs/model-tasks.md."
    )
