"""What a training job can refuse once its config is valid, checked before its W&B run
opens: the accelerator, more CPU workers than cores, and the data and model the config
describes (a CSV without its label column, labels the model has no class for, a batch
larger than the data); and what it only warns about (a warm-up longer than the run)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kiln.experiments.settings.build import build_module, seed_before_build

if TYPE_CHECKING:
    from kiln.experiments.train.train_config import TrainConfig


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


def check_worker_processes(trainer: Any) -> None:
    """Refuse ``trainer.devices`` CPU workers beyond this machine's cores before any start:
    each worker is a process of its own (~0.5 GB for a small model) that needs a core to
    step; more of them than cores never get through their first step together.

    Args:
        trainer: The job's ``TrainerConfig``.

    Raises:
        ValueError: Names the value, the cores there are and the setting that fits.
    """
    import torch

    from kiln.core.telemetry.machine import usable_cores
    from kiln.experiments.train.worker import in_process

    if in_process(trainer):  # torchrun / SLURM started the processes, or there is one
        return
    on_gpu = trainer.accelerator in ("cuda", "gpu") or (
        trainer.accelerator == "auto" and torch.cuda.is_available()
    )
    cores = usable_cores()
    if on_gpu or trainer.accelerator == "mps" or trainer.devices <= cores:
        return
    raise ValueError(
        f"trainer.devices={trainer.devices} would start {trainer.devices} CPU worker processes "
        f"on a machine where this job may use {cores} cores: give trainer.devices <= {cores} "
        "(more workers than cores share them and never step in time), or run on more nodes "
        "(trainer.num_nodes with launcher=slurm)"
    )


def check_machine(settings: TrainConfig) -> None:
    """What the config stage checks of a valid config against this machine and the model
    registry: the accelerator, the CPU workers, the model's name.

    Raises:
        ValueError: Names the value and what is valid here.
    """
    check_accelerator(settings.trainer.accelerator)
    check_worker_processes(settings.trainer)
    if settings.model:
        from kiln.models import get_model_entry

        get_model_entry(settings.model["name"])


def warn_about_schedule(settings: TrainConfig) -> None:
    """Say now, in the config stage, when the learning rate's warm-up is not shorter than
    ``trainer.max_steps`` (``kiln.models.optim.say_if_warmup_fills_the_run``)."""
    from kiln.models.optim import say_if_warmup_fills_the_run

    if settings.trainer.max_steps is not None:
        say_if_warmup_fills_the_run(settings.scheduler, settings.trainer.max_steps)


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
