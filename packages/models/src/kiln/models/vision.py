"""TIMM image classifiers: any ``timm.create_model`` architecture, CNNs and ViTs alike.

Pretrained weights come from a local file (``pretrained="<path>"``, via timm's
``pretrained_cfg_overlay``) where there is no hub. The model's timm data config (input
size, interpolation, mean, std) drives the data module's transforms.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kiln.models.image import ImageClassifier
from kiln.models.optim import OptimizerConfig, SchedulerConfig
from kiln.models.registry import register_alias, register_model

TINY_RESNET = {"layers": [1, 1, 1, 1], "channels": [8, 16, 32, 64]}
DIGITS_RESNET = {"layers": [1, 1, 1, 1], "channels": [32, 64, 128, 256]}
TINY_VIT = {"patch_size": 8, "depth": 2, "embed_dim": 32, "num_heads": 2}


class TimmClassifier(ImageClassifier):
    """Image classification with a timm model.

    Args:
        arch: A timm model name (``resnet18``, ``vit_tiny_patch16_224``, ...).
        num_classes: Classes; ``None`` takes them from the data (1000 without data).
        img_size: Input height and width; passed to the model when its constructor takes
            it (ViTs), and always to the data config. ``None``: the model's default.
        in_chans: Input channels (grayscale data is replicated to match).
        pretrained: ``False`` (random init), a local weights file (``.safetensors``,
            ``.pth``, ``.bin``), or ``True`` to fetch timm's default weights (needs the hub).
        model_kwargs: Extra ``timm.create_model`` kwargs (``depth``, ``layers``, ``drop_rate``...).
        data, optimizer, scheduler: See ``KilnModule``.
    """

    def __init__(
        self,
        arch: str = "resnet18",
        num_classes: int | None = None,
        img_size: int | None = None,
        in_chans: int = 3,
        pretrained: bool | str = False,
        model_kwargs: dict[str, Any] | None = None,
        data: Any = None,
        optimizer: OptimizerConfig | None = None,
        scheduler: SchedulerConfig | None = None,
    ) -> None:
        import timm
        from timm.data.config import resolve_data_config

        if not timm.is_model(arch):
            raise ValueError(
                f"arch={arch!r} is not a timm model; e.g. resnet18, vit_tiny_patch16_224 "
                "(timm.list_models() lists them all)"
            )
        super().__init__(
            num_classes, in_chans=in_chans, data=data, optimizer=optimizer, scheduler=scheduler
        )
        self.arch = arch
        kwargs: dict[str, Any] = {"num_classes": self.num_classes, "in_chans": in_chans}
        kwargs.update(model_kwargs or {})
        if isinstance(pretrained, str | Path):
            if not Path(pretrained).is_file():
                raise FileNotFoundError(f"pretrained weights file {str(pretrained)!r} not found")
            kwargs.update(pretrained=True, pretrained_cfg_overlay={"file": str(pretrained)})
        else:
            kwargs["pretrained"] = bool(pretrained)
        self.model, used = _create(arch, img_size, kwargs)
        # what timm.create_model needs to rebuild the architecture (export); no weights source
        self.create_kwargs = {k: v for k, v in used.items() if not k.startswith("pretrained")}
        input_size = (in_chans, img_size, img_size) if img_size else None
        self.data_config = resolve_data_config(
            {"input_size": input_size} if input_size else {}, model=self.model
        )
        self.check_input_size(self.input_size)

    def _describe(self) -> str:
        return f"timm model {self.arch!r}"

    def logits(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values)

    def set_activation_checkpointing(self, enabled: bool) -> None:
        """kiln.core's hook (``trainer.activation_checkpointing``): timm's own
        ``set_grad_checkpointing`` (non-reentrant unless ``TIMM_REENTRANT_CKPT`` says so).

        Raises:
            ValueError: The architecture does not support it.
        """
        setter = getattr(self.model, "set_grad_checkpointing", None)
        try:
            if setter is None:
                raise NotImplementedError("no set_grad_checkpointing")
            setter(enabled)
        except (AssertionError, NotImplementedError) as error:  # timm asserts where it cannot
            if not enabled:
                return
            raise ValueError(
                f"trainer.activation_checkpointing=true but timm model {self.arch!r} does not "
                f"support gradient checkpointing ({error or 'set_grad_checkpointing refused'}); "
                "use an architecture that does (resnet*, vit_*, convnext_*, ...) or set "
                "trainer.activation_checkpointing=false"
            ) from error


def _create(
    arch: str, img_size: int | None, kwargs: dict[str, Any]
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The timm model and the ``create_model`` kwargs it was built with."""
    import timm

    if img_size is None:
        return timm.create_model(arch, **kwargs), kwargs
    try:  # ViTs and friends take img_size; most CNNs do not (they take any size)
        with_size = {**kwargs, "img_size": img_size}
        return timm.create_model(arch, **with_size), with_size
    except TypeError as err:
        if "img_size" not in str(err):
            raise
        return timm.create_model(arch, **kwargs), kwargs


# -- registered models ------------------------------------------------------------------

_TINY_TIMM = {"arch": "resnet18", "img_size": 16, "model_kwargs": TINY_RESNET}


def _tiny_timm(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Shrink a ResNet or a ViT in place (same arch); other timm archs have no tiny variant."""
    arch = kwargs.get("arch")
    if arch is None:
        return dict(_TINY_TIMM)
    if arch.startswith("resnet"):
        return {"img_size": 16, "model_kwargs": TINY_RESNET}
    if arch.startswith("vit_"):
        return {"img_size": 32, "model_kwargs": TINY_VIT}
    raise ValueError(
        f"no tiny overrides for timm arch {arch!r} (known: resnet*, vit_*); pick a smaller "
        "arch yourself or run without tiny (debug=fast)"
    )


@register_model("timm", task="image-classification", tiny=_tiny_timm)
def timm_model(arch: str, **kwargs: Any) -> TimmClassifier:
    """Any timm architecture: ``arch=``, ``img_size``, ``num_classes``, ``pretrained``."""
    return TimmClassifier(arch=arch, **kwargs)


# name: (fixed arch, defaults, tiny overrides, description); each is ``timm`` with them set
ALIASES: dict[str, tuple[str, dict[str, Any], dict[str, Any], str]] = {
    "resnet-digits": ("resnet18", {"img_size": 32, "model_kwargs": DIGITS_RESNET},
                      {"model_kwargs": TINY_RESNET},
                      "A half-width ResNet-10 (timm ``resnet18``, one block per stage) at 32x32, "
                      "for ``digits``."),
    "resnet-tiny": ("resnet18", {"img_size": 16, "model_kwargs": TINY_RESNET}, {},
                    "A one-block-per-stage, 8-to-64-channel ResNet at 16x16, for tests."),
    "vit-digits": ("vit_tiny_patch16_224", {"img_size": 32, "model_kwargs": {"patch_size": 4}},
                   {"model_kwargs": TINY_VIT},
                   "A ViT-Tiny (192 wide) with 4x4 patches at 32x32, for ``digits``."),
    "vit-tiny": ("vit_tiny_patch16_224", {"img_size": 32, "model_kwargs": TINY_VIT}, {},
                 "A 2-block, 32-wide ViT with 8x8 patches at 32x32, for tests."),
}  # fmt: skip
"""The timm models kiln names: ``timm`` with an arch and its size set."""

for _name, (_arch, _defaults, _tiny, _doc) in ALIASES.items():
    register_alias(_name, "timm", _doc, fixed={"arch": _arch}, defaults=_defaults, tiny=_tiny)
