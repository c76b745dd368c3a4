"""Package attributes imported on first use (PEP 562), so that importing a config class does
not import Fabric, transformers or timm: ``--help``, ``--cfg`` and config errors pay only for
what they use."""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any, cast


class LazyPackage(types.ModuleType):
    """A package whose public names are imported from their modules when first read."""

    _exports: dict[str, str]

    def __getattr__(self, name: str) -> Any:
        module = self.__dict__.get("_exports", {}).get(name)
        if module is None:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    def __dir__(self) -> list[str]:
        return sorted({*self.__dict__, *self._exports})

    def __setattr__(self, name: str, value: Any) -> None:
        # Importing a submodule binds it on its package; where the package exports a function
        # of that name, the function stays the attribute: the name means what the package
        # exports, whichever was imported first.
        exported = self.__dict__.get("_exports", {}).get(name)
        if isinstance(value, types.ModuleType) and value.__name__ == exported:
            return
        super().__setattr__(name, value)


def lazy_package(name: str, exports: dict[str, str]) -> None:
    """Make the package ``name`` (call with ``__name__`` from its ``__init__``) lazy.

    Args:
        name: The package's module name.
        exports: Public name -> the module that defines it.
    """
    module = sys.modules[name]
    module.__class__ = LazyPackage
    package = cast(LazyPackage, module)  # what the line above made it
    package._exports = exports  # pyright: ignore[reportPrivateUsage]  # this module's class
