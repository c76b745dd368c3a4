"""OmegaConf resolvers that kiln's configs use (registered with the configs).

``${kiln_if_cuda:${trainer.accelerator},A,B}`` is ``A`` when the trainer runs on CUDA GPUs and
``B`` otherwise. The launchers (``configs/launcher``) request
``gpus_per_node: ${kiln_if_cuda:${trainer.accelerator},${trainer.devices},0}``, the GPUs that
``trainer`` asks for: submitit hides every GPU from a job that requests none
(``CUDA_VISIBLE_DEVICES=""``), and SLURM gives a job no GPU unless it asks for one.

``${kiln_direction:${optimized_metric.mode}}`` is Optuna's direction for a mode (``min`` ->
``minimize``, ``max`` -> ``maximize``): a study's ``hydra.sweeper.direction`` follows the
metric it says it optimizes (``configs/hparams_search``).

``${kiln_pt2_models:hf}`` (or ``:timm``) is the names of PyTorch's benchmark list for that
suite as one Hydra sweep value (:func:`kiln.experiments.settings.suite_lists.sweep_values`): the
``pt2_hf``/``pt2_timm`` sweep presets sweep ``model.arch`` over it, so the list lives in one file.
"""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

GPU_ACCELERATORS = ("cuda", "gpu")


def uses_cuda(accelerator: str) -> bool:
    """Whether ``trainer.accelerator`` means CUDA GPUs.

    ``auto`` means CUDA when this machine (the one composing the config) has a GPU.
    """
    accelerator = str(accelerator).lower()
    if accelerator == "auto":
        import torch

        return torch.cuda.device_count() > 0
    return accelerator in GPU_ACCELERATORS


def if_cuda(accelerator: str, on_cuda: Any, otherwise: Any) -> Any:
    """``on_cuda`` when ``accelerator`` means CUDA GPUs (:func:`uses_cuda`), else ``otherwise``.

    Args:
        accelerator: ``trainer.accelerator`` (``cuda``, ``gpu``, ``cpu``, ``auto``, ...).
        on_cuda: The value for a GPU job, e.g. ``${trainer.devices}`` GPUs per node.
        otherwise: The value for any other job, e.g. 0 GPUs.
    """
    return on_cuda if uses_cuda(accelerator) else otherwise


DIRECTIONS = {"min": "minimize", "max": "maximize"}
"""``optimized_metric.mode`` -> the Optuna sweeper's ``direction``."""


def study_direction(mode: str) -> str:
    """Optuna's ``direction`` for ``optimized_metric.mode`` (``min`` or ``max``).

    Raises:
        ValueError: ``mode`` is neither, naming the valid ones.
    """
    if mode not in DIRECTIONS:
        raise ValueError(f"optimized_metric.mode={mode!r} is not valid; use min or max")
    return DIRECTIONS[mode]


def register_resolvers() -> None:
    """Register kiln's resolvers with OmegaConf (a second call does nothing)."""
    if not OmegaConf.has_resolver("kiln_if_cuda"):
        OmegaConf.register_new_resolver("kiln_if_cuda", if_cuda)
    if not OmegaConf.has_resolver("kiln_direction"):
        OmegaConf.register_new_resolver("kiln_direction", study_direction)
    if not OmegaConf.has_resolver("kiln_pt2_models"):
        from kiln.experiments.settings.suite_lists import sweep_values

        OmegaConf.register_new_resolver("kiln_pt2_models", sweep_values)
