"""Nested configs and records as dotted keys: one lookup, one flattening."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def select(config: Any, dotted: str) -> Any:
    """The value at ``dotted`` (``"trainer.devices"``) in nested mappings or attributes;
    ``None`` where a part is missing."""
    node = config
    for part in dotted.split("."):
        if node is None:
            return None
        node = node.get(part) if isinstance(node, Mapping) else getattr(node, part, None)
    return node


def flatten(values: Mapping[str, Any], sep: str = ".", prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (``sep`` between the parts); an empty mapping
    stays a value, so a key never disappears."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, sep, f"{name}{sep}"))
        else:
            flat[name] = value
    return flat
