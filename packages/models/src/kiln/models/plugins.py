"""Load a user's plugin packages: modules that register models, data modules and callbacks.

Two ways to name one, both loaded by :func:`load_plugins`:

- an entry point in the user's ``pyproject.toml``::

      [project.entry-points."kiln.plugins"]
      my_models = "my_pkg.models"          # a module to import
      my_setup = "my_pkg.setup:register"   # or a callable to call (once)

- the ``plugins: [my_pkg.models]`` config key of ``kiln-train`` / ``kiln-bench``
  (``plugins=[my_pkg.models]`` on the command line).

Every kiln entry point, every worker process and ``create_model``'s unknown-name path call
it, so a plugin's models are found wherever kiln runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from importlib.metadata import entry_points

ENTRY_POINT_GROUP = "kiln.plugins"

_loaded: set[str] = set()


def load_plugins(extra: Iterable[str] = ()) -> list[str]:
    """Import every ``kiln.plugins`` entry point and the modules in ``extra``, once each.

    Args:
        extra: Module names (``my_pkg.models``) or ``module:callable`` targets, e.g. the
            config's ``plugins`` list.

    Returns:
        The targets loaded by this call (those loaded before are skipped).

    Raises:
        ImportError: A plugin does not import; the message names it and where it came from.
    """
    targets = [
        (ep.value, f"entry point {ep.name!r} ({ENTRY_POINT_GROUP})")
        for ep in entry_points(group=ENTRY_POINT_GROUP)
    ]
    targets += [(str(name), "the plugins config key") for name in extra]
    loaded = []
    for target, source in targets:
        if target in _loaded:
            continue
        module_name, _, attr = target.partition(":")
        try:
            module = importlib.import_module(module_name.strip())
        except ImportError as err:
            raise ImportError(
                f"kiln plugin {target!r} from {source} does not import: {err}"
            ) from err
        _loaded.add(target)  # before the call: a callable that registers runs once
        if attr:
            obj = module
            for part in attr.strip().split("."):
                obj = getattr(obj, part)
            obj()
        loaded.append(target)
    return loaded
