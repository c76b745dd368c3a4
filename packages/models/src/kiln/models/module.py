"""``KilnModule``: the one LightningModule that implements kiln.core's contract.

Subclasses (HF and TIMM wrappers, a user's plugin) only say how a batch becomes a loss,
what validation returns, and which metrics to compute; optimizers, schedules, data hooks
and the transformers/timm export live here. ``create_model`` checks the contract
(``kiln.models.contract``; ``docs/model-tasks.md``).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch

from kiln.models.contract import warn_deprecated
from kiln.models.optim import OptimizerConfig, SchedulerConfig, build_optimizer, build_scheduler


def at_least_fp32(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` promoted to float32 if it is of lower precision; float64 stays float64.

    Losses go through this instead of ``.float()``, which would down-cast a ``64-true`` run.
    """
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


class KilnModule(L.LightningModule):
    """Base class of kiln's model wrappers: implement the four abstract methods, set
    ``task`` and ``metric_keys``, and kiln trains, tests, exports and benchmarks the model.

    The contract (``docs/model-tasks.md``, checked by ``create_model``):

    - ``loss_and_count(batch)``: the batch's mean loss and its item count (samples, or
      counted tokens: then set ``items_are_tokens = True`` and define ``count_items``).
    - ``validation_step(batch, batch_idx)``: per-sample tensors, batch first.
    - ``validation_metrics(outputs)``: floats keyed by ``metric_keys``.
    - ``example_batch(batch_size, device)``: a synthetic batch of fixed shape.
    - ``tiny_data()`` (classmethod, optional): a small data module for the test kit.
    - ``export(out_dir)`` / ``load_export(out_dir)``: defaults for a ``self.model`` from
      transformers (``save_pretrained``) or timm (``save_for_hf``).

    The data module passed as ``data`` is attached (``data.attach(model)``: it checks the
    model and takes its tokenizer or transforms) by ``create_model`` once the model is built,
    or by the first dataloader call.

    Args:
        data: A kiln data module (``kiln.models.data``) or ``None``: a module without data
            still runs ``example_batch`` (benchmarks) but cannot build dataloaders.
        optimizer: AdamW settings; decay groups skip biases and norms.
        scheduler: Warm-up and decay over ``total_steps`` (set by the loop).
    """

    task: str = ""
    """What the model does; the registry's ``task`` (``image-classification``...)."""
    metric_keys: tuple[str, ...] = ()
    """The keys ``validation_metrics`` returns (``val/<key>`` in logs)."""

    def __init__(
        self,
        data: Any = None,
        optimizer: OptimizerConfig | None = None,
        scheduler: SchedulerConfig | None = None,
    ) -> None:
        missing = [name for name in ABSTRACT if _is_abstract(getattr(type(self), name))]
        if missing:  # now, not as an AttributeError or NotImplementedError mid-run
            raise TypeError(
                f"{type(self).__name__} does not implement {', '.join(missing)} of "
                "kiln.models.KilnModule (see docs/model-tasks.md)"
            )
        super().__init__()
        self.optimizer_config = optimizer or OptimizerConfig()
        self.scheduler_config = scheduler or SchedulerConfig()
        self.total_steps: int | None = None
        self.data_module = data
        self._data_attached = False

    def attach_data(self) -> None:
        """Attach the data module to the built model (once; later calls do nothing).

        ``create_model`` calls it after the factory returns, so a mismatch (labels the head
        lacks, an image size the model cannot take) fails before any training.
        """
        if self.data_module is not None and not self._data_attached:
            self.data_module.attach(self)
            self._data_attached = True

    def _attach_data(self) -> None:
        """Contract 1's attach call, kept for one release: warns, then ``attach_data()``."""
        warn_deprecated("_attach_data", f"{type(self).__name__}.__init__")
        self.attach_data()

    # -- the contract -------------------------------------------------------------------
    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict[str, Any]:
        loss, num_items = self.loss_and_count(batch)
        return {"loss": loss, "num_items": num_items}

    @abstractmethod
    def loss_and_count(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any]:
        """The batch's mean loss and the number of items it averages over."""

    def count_items(self, batch: dict[str, torch.Tensor]) -> int | torch.Tensor:
        """Items in ``batch`` (samples by default), without running the model."""
        return int(batch["labels"].shape[0])

    @abstractmethod
    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict:
        """Per-sample tensors (batch first) for ``validation_metrics``."""

    @abstractmethod
    def validation_metrics(self, outputs: dict[str, torch.Tensor]) -> dict[str, float]:
        """Metrics of the whole validation set, keyed by ``metric_keys``."""

    @abstractmethod
    def example_batch(
        self, batch_size: int, device: torch.device | str | None = None
    ) -> dict[str, torch.Tensor]:
        """A fixed-shape synthetic batch (benchmarks, tests); needs no data module."""

    @classmethod
    def tiny_data(cls) -> Any:
        """A small data module of this model's task (the test kit trains on it).

        Raises:
            NotImplementedError: The class has no tiny data; the message says what to add.
        """
        raise NotImplementedError(
            f"{cls.__name__} has no tiny_data(); define the classmethod tiny_data() returning "
            "a small data module of its task (the test kit needs it; see docs/model-tasks.md)"
        )

    def model_inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The keyword arguments of ``self.model`` for ``batch`` (the export check feeds
        them to the exported model): every key but ``labels`` by default."""
        return {k: v for k, v in batch.items() if k != "labels"}

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = build_optimizer(self, self.optimizer_config)
        scheduler = build_scheduler(optimizer, self.scheduler_config, self.total_steps)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return self._require_data().train_dataloader()

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return self._require_data().val_dataloader()

    def checkpoint_state(self) -> dict[str, Any]:
        """What ``kiln.core.fit`` saves in every checkpoint besides the weights and the loop's
        own state: the data module's pieces (its ``checkpoint_state()``: the data's
        fingerprint, which a resume compares)."""
        own: Callable[[], dict[str, Any]] | None = getattr(
            self.data_module, "checkpoint_state", None
        )
        return own() if callable(own) else {}

    # -- export ---------------------------------------------------------------------------
    def export(self, out_dir: str | Path) -> Path:
        """Write ``self.model`` so its own library loads it without kiln.

        A transformers model becomes a ``save_pretrained`` directory (with
        ``self.tokenizer`` when the module has one): ``<Architecture>.from_pretrained``
        loads it. A timm model becomes timm's ``model.safetensors`` + ``config.json``
        (with ``self.create_kwargs`` and ``self.data_config`` where set):
        ``timm.create_model("local-dir:<out_dir>", pretrained=True)`` loads it.

        Args:
            out_dir: The directory to write (created; files in it are overwritten).

        Returns:
            ``out_dir``.

        Raises:
            NotImplementedError: ``self.model`` is neither; override ``export``.
        """
        out = Path(out_dir)
        kind = self._export_kind()
        out.mkdir(parents=True, exist_ok=True)
        if kind == "transformers":
            self.model.save_pretrained(str(out))
            tokenizer = getattr(self, "tokenizer", None)
            if tokenizer is not None:
                tokenizer.save_pretrained(str(out))
            return out
        from timm.models import save_for_hf

        data_config = getattr(self, "data_config", None)
        if data_config is not None:
            data_config = {k: data_config[k] for k in ("input_size", "mean", "std")}
            data_config["interpolation"] = self.data_config.get("interpolation")
        save_for_hf(
            self.model,
            str(out),
            model_args=dict(getattr(self, "create_kwargs", {})),
            safe_serialization=True,
            data_config=data_config,
        )
        return out

    def load_export(self, out_dir: str | Path) -> None:
        """Load the weights of an ``export(out_dir)`` of this model into it.

        Raises:
            NotImplementedError: ``self.model`` is neither transformers' nor timm's.
        """
        if self._export_kind() == "transformers":
            exported = type(self.model).from_pretrained(str(out_dir))
            self.model.load_state_dict(exported.state_dict())
            return
        from safetensors.torch import load_file

        self.model.load_state_dict(load_file(str(Path(out_dir) / "model.safetensors")))

    def _export_kind(self) -> str:
        model = getattr(self, "model", None)
        if hasattr(model, "save_pretrained") and hasattr(model, "config"):
            return "transformers"
        if hasattr(model, "pretrained_cfg"):
            return "timm"
        raise NotImplementedError(
            f"{type(self).__name__} has no export: its self.model is neither a transformers "
            "nor a timm model; implement export(out_dir) and load_export(out_dir) "
            "(see docs/model-tasks.md)"
        )

    # -- helpers --------------------------------------------------------------------------
    def _require_data(self) -> Any:
        if self.data_module is None:
            raise RuntimeError(
                f"{type(self).__name__} has no data module; pass data=... to create_model "
                "(see kiln.models.data), or use example_batch() for synthetic batches"
            )
        self.attach_data()
        return self.data_module


ABSTRACT = ("loss_and_count", "validation_step", "validation_metrics", "example_batch")
"""The methods every ``KilnModule`` subclass implements."""


def _is_abstract(method: Any) -> bool:
    return getattr(method, "__isabstractmethod__", False)
