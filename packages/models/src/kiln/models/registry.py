"""The model registry, timm style: ``@register_model`` on a factory, ``create_model(name)``.

Adding a model is one decorated factory (or class) in one file; the tests pick it up
through ``list_models()`` and build it with its ``tiny`` overrides. A model that is another
one with some arguments set (``bert-tiny-cls`` is ``hf-cls`` with a BERT arch and a tiny
config) is data: ``register_alias``.
"""

from __future__ import annotations

import copy
import difflib
import fnmatch
import inspect
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kiln.models.contract import check_declared_contract, check_model

F = TypeVar("F", bound=Callable[..., Any])
TinyOverrides = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]
"""A model's test-sized overrides: a dict, or a function of the model's kwargs returning one
(for models whose tiny variant depends on them, e.g. the HF ``arch``); it raises
``ValueError`` when the model has no tiny variant for those kwargs."""


@dataclass(frozen=True)
class ModelEntry:
    """One registered model."""

    name: str
    """The name ``create_model`` takes."""
    factory: Callable[..., Any]
    """Builds the module; takes ``data``, ``optimizer``, ``scheduler`` and model kwargs."""
    task: str
    """What the model does: ``text-classification``, ``causal-lm``, ``masked-lm``,
    ``question-answering``, ``seq2seq-lm``, ``token-classification``,
    ``image-classification``, or a plugin's own."""
    tiny: dict[str, Any] = field(default_factory=dict)
    """Overrides that make a test-sized variant of the default model (empty when the model
    is already tiny)."""
    description: str = ""
    tiny_for: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    """The tiny overrides for given model kwargs, when they depend on them."""
    alias_of: str | None = None
    """For an alias: the registered model it sets arguments of (its ``factory`` is that one's)."""
    fixed: dict[str, Any] = field(default_factory=dict)
    """Arguments an alias sets that the caller cannot change (the ``arch``)."""
    defaults: dict[str, Any] = field(default_factory=dict)
    """Arguments an alias sets that the caller can override (dicts merged one level)."""
    contract: int | None = None
    """The model contract version its plugin declares (``None``: not declared)."""

    def tiny_overrides(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The overrides that shrink this model as configured by ``kwargs``."""
        return self.tiny_for(kwargs) if self.tiny_for is not None else dict(self.tiny)

    def factory_kwargs(self, overrides: dict[str, Any]) -> dict[str, Any]:
        """The factory's arguments for the caller's ``overrides``: an alias adds its own."""
        for key in self.fixed.keys() & overrides.keys():
            raise ValueError(
                f"model {self.name!r} fixes {key}={self.fixed[key]!r}; use model "
                f"{self.alias_of!r} to choose {key}"
            )
        # A copy: a module that changed a default dict in place would change the alias.
        return {**self.fixed, **merge_kwargs(copy.deepcopy(self.defaults), overrides)}


_REGISTRY: dict[str, ModelEntry] = {}
_BUILTIN_MODULES = (
    "kiln.models.hf",
    "kiln.models.hf_masked_lm",
    "kiln.models.hf_question_answering",
    "kiln.models.hf_seq2seq",
    "kiln.models.hf_token_classification",
    "kiln.models.vision",
)


def _load_models() -> None:
    """Import kiln's own model modules (they register on import), then the plugins."""
    import importlib

    from kiln.models.plugins import load_plugins

    for module in _BUILTIN_MODULES:
        importlib.import_module(module)
    load_plugins()


def register_model(
    name: str | None = None,
    *,
    task: str,
    tiny: TinyOverrides | None = None,
    contract: int | None = None,
) -> Callable[[F], F]:
    """Register a factory function or a module class under ``name``.

    Args:
        name: The registry name; defaults to the factory's ``__name__``.
        task: What the model does (selects the data modules that fit it).
        tiny: ``create_model`` overrides for a test-sized variant (tests build every
            registered model with them; ``create_model(name, tiny=True)`` applies them), or
            a function of the model's kwargs returning them (see ``TinyOverrides``).
        contract: The version of kiln's model contract the model is written for
            (``kiln.models.contract.CONTRACT_VERSION``); ``None`` takes the current one.

    Returns:
        A decorator that registers and returns the factory unchanged.

    Raises:
        ValueError: ``contract`` is a version this kiln does not run; the message says
            what to change (warns, ``ContractDeprecationWarning``, for the previous one).
    """

    def decorator(factory: F) -> F:
        key = name or factory.__name__
        check_declared_contract(key, contract)
        doc = (factory.__doc__ or "").strip().splitlines()
        tiny_for = tiny if callable(tiny) else None
        default_tiny = tiny({}) if tiny_for is not None else dict(tiny or {})
        description = doc[0] if doc else ""
        _add(ModelEntry(key, factory, task, default_tiny, description, tiny_for, contract=contract))
        return factory

    return decorator


def register_alias(
    name: str,
    base: str,
    description: str,
    *,
    fixed: dict[str, Any] | None = None,
    defaults: dict[str, Any] | None = None,
    tiny: dict[str, Any] | None = None,
) -> None:
    """Register ``name`` as the registered model ``base`` with some arguments set.

    Args:
        name: The alias's registry name.
        base: The registered model it builds (its task and arguments are the alias's).
        description: One line for ``list_models`` readers (the factory docstring's role).
        fixed: Arguments the caller cannot change (passing one fails naming ``base``).
        defaults: Arguments the caller can override; a dict argument the caller passes
            (``config_overrides``, ``model_kwargs``) is merged over the default one.
        tiny: ``create_model`` overrides for the alias's test-sized variant (``{}``: it
            is already tiny).
    """
    target = get_model_entry(base)
    _add(
        ModelEntry(
            name,
            target.factory,
            target.task,
            dict(tiny or {}),
            description,
            alias_of=base,
            fixed=dict(fixed or {}),
            defaults=dict(defaults or {}),
            contract=target.contract,
        )
    )


def _add(entry: ModelEntry) -> None:
    if entry.name in _REGISTRY:
        raise ValueError(
            f"model {entry.name!r} is already registered (by {_REGISTRY[entry.name].factory})"
        )
    _REGISTRY[entry.name] = entry


def get_model_entry(name: str) -> ModelEntry:
    """The registry entry for ``name``; an unknown name lists the registered ones.

    A name not registered yet loads the ``kiln.plugins`` entry points first (a process that
    never ran kiln's entry points, e.g. a notebook, still finds a plugin's models).
    """
    if name not in _REGISTRY:
        _load_models()
    if name not in _REGISTRY:
        close = [n for n in _REGISTRY if name.lower() in n or n in name.lower()]
        hint = f" (did you mean: {', '.join(close)}?)" if close else ""
        raise ValueError(
            f"unknown model {name!r}{hint}; registered models: {', '.join(list_models())}. "
            "To add one, register it with @kiln.models.register_model in a module kiln "
            'loads: an entry point in your pyproject.toml ([project.entry-points."kiln.plugins"]'
            ' my_models = "my_pkg.models") or the config key plugins=[my_pkg.models]'
        )
    return _REGISTRY[name]


def merge_kwargs(kwargs: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with ``top`` on top; dict values (``config_overrides``...) merged one level."""
    merged = dict(kwargs)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def valid_arguments(name: str) -> list[str]:
    """The keyword arguments ``create_model(name, ...)`` takes (factory and module class)."""
    entry = get_model_entry(name)
    names = ["tiny"]
    functions: list[Any] = [entry.factory]
    try:
        cls = typing.get_type_hints(entry.factory).get("return")
    except Exception:
        cls = None
    if isinstance(cls, type):
        functions += [c.__init__ for c in cls.__mro__ if "__init__" in vars(c)]
    for function in functions:
        for param in inspect.signature(function).parameters.values():
            if param.kind in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD):
                if param.name != "self" and param.name not in names:
                    names.append(param.name)
        if function.__qualname__.startswith("LightningModule"):
            break
    return names


def call_parameters(target: Callable[..., Any]) -> tuple[dict[str, Any], bool]:
    """The keyword arguments a call of ``target`` takes, with their annotations.

    A class's ``__init__`` chain is followed through ``**kwargs`` it hands to
    ``super().__init__``, leaving out what the subclass sets itself there
    (``Seq2SeqData`` sets ``TextData``'s ``text_column``); a factory function through the
    class it returns. Lightning's own classes end the walk.

    Args:
        target: A class or a function.

    Returns:
        ``{name: annotation}`` (``typing.Any`` where there is none or it does not resolve),
        and whether the call also takes keyword arguments not named there (a ``**kwargs``
        that is not handed on, e.g. to an HF config).
    """
    params: dict[str, Any] = {}
    fixed: set[str] = set()
    chain, ends_in_base = _init_chain(target)
    for function, owner in chain:
        try:
            signature = inspect.signature(function)
        except (TypeError, ValueError):
            return params, True
        hints = _hints(function)
        rest = None
        for param in signature.parameters.values():
            if param.kind is param.VAR_KEYWORD:
                rest = param.name
            elif param.kind in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD):
                if param.name not in ("self", "cls") and param.name not in {*params, *fixed}:
                    params[param.name] = hints.get(param.name, Any)
        if rest is None:
            return params, False
        if owner is not None:
            handed_on, sets = _super_call(function, rest)
            if not handed_on:
                return params, True
            fixed |= sets
    return params, not ends_in_base


def _init_chain(target: Callable[..., Any]) -> tuple[list[tuple[Any, type | None]], bool]:
    """The functions a call of ``target`` may run with its keyword arguments, each with the
    class that defines it: a class's ``__init__`` in MRO order; a function, then the
    ``__init__`` chain of the class its return annotation names. The chain stops before
    Lightning's classes and ``object`` (then the second value is true)."""
    cls = target if isinstance(target, type) else None
    head: list[tuple[Any, type | None]] = []
    if cls is None:
        head = [(target, None)]
        try:
            returned = typing.get_type_hints(target).get("return")
        except Exception:
            returned = None
        cls = returned if isinstance(returned, type) else None
    chain: list[tuple[Any, type | None]] = []
    for c in cls.__mro__ if cls else ():
        if c is object or c.__module__.startswith("lightning"):
            return head + chain, True
        if "__init__" in vars(c):
            chain.append((vars(c)["__init__"], c))
    return head + chain, False


def _hints(function: Any) -> dict[str, Any]:
    """``function``'s annotations, each resolved on its own (one that names a type imported
    only for type checkers stays unresolved: ``typing.Any``)."""
    try:
        return typing.get_type_hints(function)
    except Exception:
        pass
    hints = {}
    for key, value in getattr(function, "__annotations__", {}).items():
        try:
            hints[key] = eval(value, function.__globals__) if isinstance(value, str) else value
        except Exception:
            hints[key] = Any
    return hints


def _super_call(function: Any, rest: str) -> tuple[bool, set[str]]:
    """Whether ``function`` hands ``**rest`` to ``super().__init__``, and the keywords it
    sets itself in that call."""
    import ast
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return False, set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "__init__"
            and isinstance(node.func.value, ast.Call)
            and isinstance(node.func.value.func, ast.Name)
            and node.func.value.func.id == "super"
        ):
            words = node.keywords
            handed = any(
                k.arg is None and isinstance(k.value, ast.Name) and k.value.id == rest
                for k in words
            )
            return handed, {k.arg for k in words if k.arg is not None}
    return False, set()


def model_parameters(name: str) -> tuple[dict[str, Any], bool]:
    """:func:`call_parameters` of model ``name``'s factory (``tiny`` included), less the
    arguments every model shares (``data``, ``optimizer``, ``scheduler``)."""
    params, open_ = call_parameters(get_model_entry(name).factory)
    shared = {k: v for k, v in params.items() if k not in _SHARED_ARGUMENTS}
    return {"tiny": bool, **shared}, open_


def check_model_arguments(name: str, keys: list[str]) -> None:
    """Refuse, before anything is built, an argument model ``name`` does not take (what
    ``create_model`` refuses); a model whose factory takes open ``**kwargs`` (an HF config's
    fields) is left to its own checks.

    Raises:
        ValueError: Names the model, the argument, the closest valid one and all of them.
    """
    params, open_ = model_parameters(name)
    for key in [] if open_ else keys:
        if key not in params:
            raise ValueError(_unknown_argument(name, key, valid_arguments(name)))


def task_data_class(name: str) -> type | None:
    """The data module class model ``name``'s task trains on: the class of its module's
    ``tiny_data()`` (``None``: the model's class has none)."""
    entry = get_model_entry(name)
    try:
        cls = typing.get_type_hints(entry.factory).get("return")
    except Exception:
        cls = entry.factory if isinstance(entry.factory, type) else None
    if not isinstance(cls, type):
        return None
    if cls not in _TINY_DATA:
        try:
            _TINY_DATA[cls] = type(cls.tiny_data())  # pyright: ignore[reportAttributeAccessIssue]
        except Exception:  # no tiny_data (contract 1), or one that needs more than a call
            _TINY_DATA[cls] = None
    return _TINY_DATA[cls]


_TINY_DATA: dict[type, type | None] = {}


def create_model(name: str, *, tiny: bool = False, **overrides: Any) -> Any:
    """Build the registered model ``name``.

    Args:
        name: A name from ``list_models()``.
        tiny: Build the model's test-sized variant: its registered ``tiny`` overrides are
            applied on top of ``overrides`` (``debug=fast`` sets ``model.tiny=true``).
        **overrides: Passed to the factory (``data``, ``optimizer``, ``scheduler`` and
            the model's own kwargs, e.g. ``num_labels`` or ``config_overrides``).

    Returns:
        The LightningModule (a ``kiln.models.KilnModule``).

    Raises:
        ValueError: Unknown model name, an argument the model does not take (naming the
            valid ones), or ``tiny=True`` for a model without a tiny variant.
        TypeError: The built model lacks part of the contract
            (:class:`kiln.models.contract.KilnModel`); the message names what.
    """
    entry = get_model_entry(name)
    if tiny:
        model_kwargs = {k: v for k, v in overrides.items() if k not in _SHARED_ARGUMENTS}
        try:
            overrides = merge_kwargs(overrides, entry.tiny_overrides(model_kwargs))
        except ValueError as err:
            raise ValueError(f"model {name!r} has no tiny variant (tiny=True): {err}") from err
    kwargs = entry.factory_kwargs(overrides)
    try:
        module = entry.factory(**kwargs)
    except TypeError as err:
        # Python's "got an unexpected keyword argument 'x'" for one of *our* arguments:
        # say which model and what it takes (a TypeError from deeper down passes as is).
        match = re.search(r"unexpected keyword argument '(\w+)'", str(err))
        if match is None or match.group(1) not in overrides:
            raise
        raise ValueError(_unknown_argument(name, match.group(1), valid_arguments(name))) from err
    check_model(module, name, entry.contract)
    attach = getattr(module, "attach_data", None)
    if callable(attach):  # the data checks itself against the built model, before training
        attach()
    return module


_SHARED_ARGUMENTS = ("data", "optimizer", "scheduler")


def _unknown_argument(model: str, key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"model {model!r} has no argument {key!r}{hint}; valid arguments: {', '.join(valid)}"


def list_models(pattern: str | None = None, task: str | None = None) -> list[str]:
    """Registered model names, sorted, optionally filtered by a glob and a task.

    The ``kiln.plugins`` entry points are loaded first, so a plugin's models are listed.
    """
    _load_models()
    names = sorted(n for n, e in _REGISTRY.items() if task is None or e.task == task)
    return [n for n in names if pattern is None or fnmatch.fnmatch(n, pattern)]
