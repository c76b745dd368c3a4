"""The model contract of kiln.models, as checked interfaces (``docs/model-tasks.md``).

kiln.core's loop needs the hooks in ``kiln.core.module_contract``; kiln.models builds them from four
methods a model implements (:class:`KilnModel`) and two class attributes. ``create_model``
checks a built model against :class:`KilnModel` and fails naming what is missing, before
any data is loaded. A data module states what it needs of the model as a Protocol of its
own (:class:`ImageModel`, :class:`TextModel`) and checks it when it is attached.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

DOCS = "docs/model-tasks.md"


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


def check_model(module: Any, name: str) -> None:
    """Fail naming what ``module`` (built as model ``name``) lacks of :class:`KilnModel`.

    Raises:
        TypeError: A method or attribute is missing, or ``metric_keys`` is empty.
    """
    missing = missing_members(module, KilnModel)
    if missing:
        raise TypeError(
            f"model {name!r} ({type(module).__name__}) does not implement kiln's model "
            f"contract: it lacks {', '.join(missing)} (subclass kiln.models.KilnModule and "
            f"implement them; see {DOCS})"
        )
    keys = module.metric_keys
    if not keys or isinstance(keys, str) or not all(isinstance(k, str) for k in keys):
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
