"""What a training job can refuse once its config is valid, checked before its W&B run
opens: the accelerator, and the data and model the config describes (a CSV without its
label column, labels the model has no class for, a batch larger than the data)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kiln.experiments.build import build_module, seed_before_build

if TYPE_CHECKING:
    from kiln.experiments.train.schema import TrainConfig


def check_accelerator(name: str) -> None:
    """Refuse ``trainer.accelerator=<name>`` on a machine without such a device.

    Raises:
        ValueError: Names the accelerator and the ones this machine has.
    """
    from lightning.fabric.accelerators import ACCELERATOR_REGISTRY

    kinds = ("cuda", "mps") if name == "gpu" else (name,)
    entries = [ACCELERATOR_REGISTRY[k] for k in kinds if k in ACCELERATOR_REGISTRY]
    if not entries:
        return  # "auto", or a name Fabric itself refuses with the valid ones
    if not any(entry["accelerator"].is_available() for entry in entries):
        here = sorted(
            key
            for key in ACCELERATOR_REGISTRY.available_accelerators()
            if ACCELERATOR_REGISTRY[key]["accelerator"].is_available()
        )
        raise ValueError(
            f"trainer.accelerator={name!r}: this machine has no such device (it has: "
            f"{', '.join(here)}); use trainer.accelerator=auto or one of those"
        )


def build_checked(settings: TrainConfig) -> Any:
    """The job's module, built as a worker builds it (seeded first), with its data set up
    and its loaders made: a data error fails here, not in the first step.

    Returns:
        The module (the single-process job trains it; a multi-process job's workers build
        their own).
    """
    seed_before_build(settings.trainer.seed)
    module = build_module(settings)
    if getattr(module, "data_module", None) is not None:
        module.train_dataloader()  # builds the sets; too few rows for one batch fails here
        module.val_dataloader()
    check_test_split(module, settings)
    return module


def check_test_split(module: Any, settings: TrainConfig) -> None:
    """With ``test_after_fit``, fail now, not after training, where there is no test split."""
    if settings.test_after_fit:
        if module.data_module is None:
            raise ValueError("test_after_fit=true needs a data module with a test split")
        module.data_module.test_dataloader()
