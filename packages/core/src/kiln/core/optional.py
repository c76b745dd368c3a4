"""Optional dependencies: import them where they are used, with an error that says which
extra installs them (the workspace's own environment has every extra)."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str) -> ModuleType:
    """Import ``module``, or fail naming the pip extra that provides it.

    Args:
        module: The module to import, e.g. ``"sklearn.datasets"``.
        extra: The distribution and extra that install it, e.g. ``"kiln-models[examples]"``.

    Raises:
        ModuleNotFoundError: ``module`` is not installed; the message says what to install.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"{module} is not installed; it comes with the optional extra: pip install '{extra}'"
        ) from exc
