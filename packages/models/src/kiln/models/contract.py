"""The model contract of kiln.models, as checked interfaces (``docs/model-tasks.md``).

kiln.core's loop needs the hooks in ``kiln.core.module_contract``; kiln.models builds them from four
methods a model implements (:class:`KilnModel`) and two class attributes. ``create_model``
checks a built model against :class:`KilnModel` and fails naming what is missing, before
any data is loaded. A data module states what it needs of the model as a Protocol of its
own (:class:`ImageModel`, :class:`TextModel`) and checks it when it is attached.

The contract has a version, :data:`CONTRACT_VERSION`. A plugin states the version it was
written for with ``register_model(..., contract=N)``; kiln accepts the versions in
:data:`SUPPORTED_CONTRACTS` (the current one and the one before it) and refuses others when
the model is registered, saying what to change. What contract 1 had and contract 2 does not
keeps working for the one release, with a :class:`ContractDeprecationWarning` naming the
replacement (:data:`MIGRATION`).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

DOCS = "docs/model-tasks.md"
MIGRATION_DOCS = "docs/extending.md#migrating-from-the-previous-release"

CONTRACT_VERSION = 2
"""The version of the model contract this kiln.models implements."""
SUPPORTED_CONTRACTS = (1, 2)
"""The versions a plugin may declare: contract 1 runs with deprecation warnings."""
MIGRATION = {
    "_attach_data": "delete the self._attach_data() call at the end of __init__: "
    "create_model attaches the data module (KilnModule.attach_data) after the factory returns",
    "metric_keys": "set the class attribute metric_keys to the keys validation_metrics returns, "
    "e.g. metric_keys = ('accuracy', 'f1', 'loss')",
    "tiny_data": "define the classmethod tiny_data() returning a small data module of the task "
    "(the test kit trains on it; ImageClassifier and the HF task wrappers have one)",
}
"""What changed from contract 1 to contract 2, as the fix for each name."""


class ContractDeprecationWarning(DeprecationWarning):
    """A plugin uses what a previous model contract had; the message says what replaces it.

    Shown by default (Python hides plain ``DeprecationWarning`` outside ``__main__``), so
    ``kiln-train`` prints it.
    """


warnings.filterwarnings("default", category=ContractDeprecationWarning)


def warn_deprecated(name: str, subject: str, stacklevel: int = 3) -> None:
    """Warn that ``subject`` relies on contract 1's ``name``, with its fix (:data:`MIGRATION`)."""
    warnings.warn(
        f"{subject} relies on {name!r} of kiln's model contract 1, which contract "
        f"{CONTRACT_VERSION} replaces; it works in this release only. To migrate: "
        f"{MIGRATION[name]} (see {MIGRATION_DOCS})",
        ContractDeprecationWarning,
        stacklevel=stacklevel,
    )


def check_declared_contract(name: str, contract: int | None) -> None:
    """Refuse a model registered for a contract this kiln does not run; warn on contract 1.

    Args:
        name: The model's registry name.
        contract: The version its plugin declares (``None``: not declared, taken as current).

    Raises:
        ValueError: ``contract`` is not one of :data:`SUPPORTED_CONTRACTS`; the message says
            whether to upgrade kiln or which changes migrate the plugin.
    """
    if contract is None or contract == CONTRACT_VERSION:
        return
    if isinstance(contract, bool) or not isinstance(contract, int) or contract < 1:
        raise ValueError(
            f"model {name!r}: contract={contract!r} is not a contract version: it must be an int "
            ">= 1, the version of kiln's model contract the plugin was written for (this kiln "
            f"implements {CONTRACT_VERSION} and runs {', '.join(map(str, SUPPORTED_CONTRACTS))}), "
            "or leave contract unset"
        )
    if contract > CONTRACT_VERSION:
        raise ValueError(
            f"model {name!r} is written for kiln's model contract {contract}, but the installed "
            f"kiln-models implements contract {CONTRACT_VERSION} (supports "
            f"{', '.join(map(str, SUPPORTED_CONTRACTS))}): upgrade kiln-models, or install the "
            "plugin's release for this kiln"
        )
    if contract not in SUPPORTED_CONTRACTS:
        steps = "; ".join(f"{key}: {fix}" for key, fix in MIGRATION.items())
        raise ValueError(
            f"model {name!r} is written for kiln's model contract {contract}, which this kiln "
            f"(contract {CONTRACT_VERSION}) no longer runs. Migrate it to contract "
            f"{CONTRACT_VERSION} and register it with contract={CONTRACT_VERSION}: {steps} "
            f"(see {MIGRATION_DOCS})"
        )
    steps = "; ".join(MIGRATION.values())
    warnings.warn(
        f"model {name!r} is registered for kiln's model contract {contract}; it runs in this "
        f"release with warnings, and the next one refuses it. To migrate to contract "
        f"{CONTRACT_VERSION}: {steps}; then register it with contract={CONTRACT_VERSION} "
        f"(see {MIGRATION_DOCS})",
        ContractDeprecationWarning,
        stacklevel=3,
    )


@runtime_checkable
class KilnModel(Protocol):
    """What every model ``create_model`` returns has (``KilnModule`` gives the rest).

    Attributes:
        task: What the model does (``image-classification``, ``masked-lm``, ...): the
            registry's ``task`` and the kind of data it takes.
        metric_keys: The keys ``validation_metrics`` returns (logged as ``val/<key>``; the
            test kit checks them).
    """

    task: str
    metric_keys: tuple[str, ...]

    def loss_and_count(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any]:
        """The batch's mean loss and how many items (samples, or tokens) it averages over."""

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict:
        """Per-sample tensors (batch first) that ``validation_metrics`` needs."""

    def validation_metrics(self, outputs: dict[str, torch.Tensor]) -> dict[str, float]:
        """The metrics of the whole validation set from the concatenated outputs."""

    def example_batch(self, batch_size: int, device: Any = None) -> dict[str, torch.Tensor]:
        """A fixed-shape synthetic batch (benchmarks, tests); needs no data."""

    def export(self, out_dir: str | Path) -> Path:
        """Write the model for its own library (``kiln-export``)."""

    def load_export(self, out_dir: str | Path) -> None:
        """Load the weights of an ``export`` into this model."""


@runtime_checkable
class ImageModel(Protocol):
    """What ``ImageClassificationData`` asks of the model it is attached to.

    Attributes:
        num_classes: Classes of the model's head (the data's labels must fit).
        data_config: timm-style transform settings: ``input_size`` (channels, height,
            width), ``mean``, ``std``, ``interpolation`` (``bilinear``, ``bicubic``...).
    """

    num_classes: int
    data_config: dict[str, Any]

    def check_input_size(self, input_size: tuple[int, int, int]) -> None:
        """Fail (``ValueError``) if the model cannot take images of ``input_size``."""


@runtime_checkable
class TextModel(Protocol):
    """What kiln's text data modules ask of the model they are attached to.

    Attributes:
        tokenizer: An HF tokenizer (used unless the data module was given one).

    Optional: ``vocab_size`` (rows of the input embedding: a larger tokenizer fails) and
    ``max_positions`` (the longest sequence the model takes: a longer ``max_length`` fails).
    """

    tokenizer: Any


def missing_members(obj: Any, protocol: type) -> list[str]:
    """The attributes and methods of ``protocol`` that ``obj`` lacks (or leaves abstract)."""
    names = {*getattr(protocol, "__annotations__", {}), *vars(protocol)}
    missing = []
    for name in sorted(n for n in names if not n.startswith("_")):
        try:
            value = getattr(obj, name)
        except (AttributeError, NotImplementedError):
            missing.append(name)
            continue
        if getattr(value, "__isabstractmethod__", False):
            missing.append(name)
    return missing


def check_model(module: Any, name: str, contract: int | None = None) -> None:
    """Fail naming what ``module`` (built as model ``name``) lacks of :class:`KilnModel`.

    A model without ``metric_keys`` whose plugin does not declare contract 2 (contract 1
    had none) warns instead (:class:`ContractDeprecationWarning`) and trains.

    Raises:
        TypeError: A method or attribute is missing, or ``metric_keys`` is empty in a model
            registered with ``contract=2``.
    """
    keys = getattr(module, "metric_keys", None)
    missing = missing_members(module, KilnModel)
    # contract 1 had no metric_keys: such a model still trains (only the test kit reads them)
    legacy = not keys and contract != CONTRACT_VERSION and set(missing) <= {"metric_keys"}
    if legacy:
        warn_deprecated("metric_keys", f"model {name!r} ({type(module).__name__})", 3)
        missing = []
    if missing:
        raise TypeError(
            f"model {name!r} ({type(module).__name__}) does not implement kiln's model "
            f"contract: it lacks {', '.join(missing)} (subclass kiln.models.KilnModule and "
            f"implement them; see {DOCS})"
        )
    bad_keys = not keys or isinstance(keys, str) or not all(isinstance(k, str) for k in keys)
    if bad_keys and not legacy:
        raise TypeError(
            f"model {name!r} ({type(module).__name__}): metric_keys={keys!r} must be a "
            "non-empty tuple of the names validation_metrics returns, e.g. ('accuracy', 'loss')"
        )
    if not isinstance(module.task, str) or not module.task:
        raise TypeError(
            f"model {name!r} ({type(module).__name__}) has no task; set the class attribute "
            "task (e.g. 'image-classification')"
        )


def require(module: Any, protocol: type, user: str) -> None:
    """Fail naming what ``module`` lacks of ``protocol``, which ``user`` (a data module) needs.

    Raises:
        TypeError: One line naming the model class, ``user`` and the missing members.
    """
    missing = missing_members(module, protocol)
    if missing:
        raise TypeError(
            f"{user} needs the model to provide {', '.join(missing)} "
            f"(kiln.models.contract.{protocol.__name__}); {type(module).__name__} does not. "
            f"Subclass the matching kiln base class or add them (see {DOCS})"
        )
