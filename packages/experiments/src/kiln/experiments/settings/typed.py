"""The config groups without a schema of their own, checked against what reads them.

``data`` and each ``callbacks`` entry name a ``_target_``; ``model`` names a registered
model. Their keys are the arguments of that class or factory, so its annotations are their
schema (:func:`kiln.models.registry.call_parameters`): every value is checked against them in
the config stage, before anything is built or a W&B run opens, and a new argument is covered
as soon as it is annotated. Booleans are strict (``true`` or ``false``: the string ``'no'``
would read as true); ``Literal[...]`` lists the allowed values.
"""

from __future__ import annotations

import collections.abc
import difflib
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

_SCALARS: dict[Any, tuple[Callable[[Any], bool], str]] = {
    bool: (lambda v: isinstance(v, bool), "true or false"),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    float: (lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number"),
    str: (lambda v: isinstance(v, str), "a string"),
    type(None): (lambda v: v is None, "null"),
}
"""The annotations a config value can be checked against directly, and their words."""
_SEQUENCES = (list, tuple, set, collections.abc.Sequence)
_MAPPINGS = (dict, collections.abc.Mapping)


def allowed(annotation: Any, value: Any) -> str | None:
    """``None`` when ``value`` fits ``annotation``, else what the annotation allows, in words."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        arms = [allowed(arm, value) for arm in typing.get_args(annotation)]
        return None if None in arms else " or ".join(dict.fromkeys(a for a in arms if a))
    if origin is typing.Literal:
        choices = typing.get_args(annotation)
        return None if value in choices else f"one of: {', '.join(map(str, choices))}"
    if annotation in _SCALARS:
        fits, words = _SCALARS[annotation]
        return None if fits(value) else words
    if (origin or annotation) in _SEQUENCES:
        if not isinstance(value, list | tuple):
            return "a list"
        items = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        if len(items) == 1 and any(allowed(items[0], item) for item in value):
            return f"a list (each item {allowed(items[0], object())})"
        return None
    if (origin or annotation) in _MAPPINGS:
        return None if isinstance(value, Mapping) else "a mapping"
    return None  # Any, or a class a config cannot hold (a tokenizer object): its code decides


def check_arguments(
    prefix: str,
    owner: str,
    params: dict[str, Any],
    values: Mapping[str, Any],
    open_: bool = False,
) -> None:
    """Refuse a value that does not fit its parameter's annotation, or (unless ``open_``) a
    key that is no parameter.

    Args:
        prefix: The group's dotted path with its dot (``data.``).
        owner: What takes the values, for the message (``CausalLMData``).
        params: Its parameters and their annotations (``call_parameters``).
        values: The group's resolved values (Hydra's ``_target_`` and such are skipped).
        open_: The owner also takes keyword arguments it does not name.

    Raises:
        ValueError: One line naming the key, the value and what is allowed.
    """
    for key, value in values.items():
        if key.startswith("_") and key.endswith("_"):
            continue
        if key not in params:
            if open_:
                continue
            close = difflib.get_close_matches(key, list(params), n=2)
            hint = f"did you mean {' or '.join(prefix + c for c in close)}? " if close else ""
            raise ValueError(
                f"{prefix}{key} is not an argument of {owner} (nothing would read it): {hint}"
                f"valid keys of {prefix.rstrip('.')}: {', '.join(sorted(params))}"
            )
        wanted = allowed(params[key], value)
        if wanted is not None:
            raise ValueError(
                f"{prefix}{key}={value!r} is not valid: use {wanted} (the {key} argument of "
                f"{owner})"
            )


def target_class(target: str, prefix: str) -> Callable[..., Any]:
    """The class or function a ``_target_`` names.

    Raises:
        ValueError: It does not import; the message names the key.
    """
    from hydra.utils import get_object

    try:
        return get_object(target)
    except Exception as err:
        raise ValueError(f"{prefix}_target_={target!r} does not import: {err}") from err


def check_target(prefix: str, values: Mapping[str, Any] | None) -> None:
    """Check a group that names a ``_target_`` (``data``, one callback) against it."""
    from kiln.models.registry import call_parameters

    if not values or "_target_" not in values:
        return
    target = target_class(str(values["_target_"]), prefix)
    params, open_ = call_parameters(target)
    check_arguments(prefix, getattr(target, "__name__", str(target)), params, values, open_)


def check_model(values: Mapping[str, Any] | None) -> None:
    """Check the ``model`` group against the registered model's factory: its types, the
    arguments an alias fixes, and (for a model that takes no others) unknown keys."""
    from kiln.models.registry import check_model_arguments, get_model_entry, model_parameters

    if not values or "name" not in values:
        return
    name = values["name"]
    if not isinstance(name, str):
        raise ValueError(f"model.name={name!r} is not valid: use a registered model's name")
    try:
        entry = get_model_entry(name)
    except ValueError:
        return  # the config stage refuses it by name once the job's plugins are loaded
    kwargs = {k: v for k, v in values.items() if k != "name"}
    entry.factory_kwargs({k: v for k, v in kwargs.items() if k != "tiny"})  # an alias's fixed
    check_model_arguments(name, list(kwargs))
    params, _ = model_parameters(name)
    check_arguments("model.", f"model {name}", params, kwargs, open_=True)


def check_groups(settings: Any) -> None:
    """Check ``data``, every ``callbacks`` entry and ``model`` of a validated config."""
    check_target("data.", getattr(settings, "data", None))
    for name, callback in (getattr(settings, "callbacks", None) or {}).items():
        if callback is not None:
            check_target(f"callbacks.{name}.", callback)
    check_model(settings.model)
