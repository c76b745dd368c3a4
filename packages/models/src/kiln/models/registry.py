"""The model registry, timm style: ``@register_model`` on a factory, ``create_model(name)``.

Adding a model is one decorated factory (or class) in one file; the tests pick it up
through ``list_models()`` and build it with its ``tiny`` overrides.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class ModelEntry:
    """One registered model."""

    name: str
    """The name ``create_model`` takes."""
    factory: Callable[..., Any]
    """Builds the module; takes ``data``, ``optimizer``, ``scheduler`` and model kwargs."""
    task: str
    """``text-classification``, ``causal-lm`` or ``image-classification``."""
    tiny: dict[str, Any] = field(default_factory=dict)
    """Overrides that make a test-sized variant (empty when the model is already tiny)."""
    description: str = ""


_REGISTRY: dict[str, ModelEntry] = {}


def register_model(
    name: str | None = None, *, task: str, tiny: dict[str, Any] | None = None
) -> Callable[[F], F]:
    """Register a factory function or a module class under ``name``.

    Args:
        name: The registry name; defaults to the factory's ``__name__``.
        task: What the model does (selects the data modules that fit it).
        tiny: ``create_model`` overrides for a test-sized variant (tests build every
            registered model with them).

    Returns:
        A decorator that registers and returns the factory unchanged.
    """

    def decorator(factory: F) -> F:
        key = name or factory.__name__
        if key in _REGISTRY:
            raise ValueError(f"model {key!r} is already registered (by {_REGISTRY[key].factory})")
        doc = (factory.__doc__ or "").strip().splitlines()
        _REGISTRY[key] = ModelEntry(key, factory, task, dict(tiny or {}), doc[0] if doc else "")
        return factory

    return decorator


def get_model_entry(name: str) -> ModelEntry:
    """The registry entry for ``name``; an unknown name lists the registered ones."""
    if name not in _REGISTRY:
        close = [n for n in _REGISTRY if name.lower() in n or n in name.lower()]
        hint = f" (did you mean: {', '.join(close)}?)" if close else ""
        raise ValueError(
            f"unknown model {name!r}{hint}; registered models: {', '.join(list_models())}"
        )
    return _REGISTRY[name]


def create_model(name: str, **overrides: Any) -> Any:
    """Build the registered model ``name``.

    Args:
        name: A name from ``list_models()``.
        **overrides: Passed to the factory (``data``, ``optimizer``, ``scheduler`` and
            the model's own kwargs, e.g. ``num_labels`` or ``config_overrides``).

    Returns:
        The LightningModule (a ``kiln.models.KilnModule``).
    """
    return get_model_entry(name).factory(**overrides)


def list_models(pattern: str | None = None, task: str | None = None) -> list[str]:
    """Registered model names, sorted, optionally filtered by a glob and a task."""
    names = sorted(n for n, e in _REGISTRY.items() if task is None or e.task == task)
    return [n for n in names if pattern is None or fnmatch.fnmatch(n, pattern)]
