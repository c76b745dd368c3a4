"""What ``configure_optimizers`` may return, and how kiln reads it."""

from __future__ import annotations

from typing import Any, cast

import torch

from kiln.core.module_contract import as_dict

# Lightning's scheduler-dict keys that kiln honours as they are (the rest are rejected)
_SUPPORTED = {"interval": "step", "frequency": 1}
_IGNORED = {"scheduler", "name", "strict"}


def unpack_optimizers(configured: Any) -> tuple[torch.optim.Optimizer, Any]:
    """Split what ``configure_optimizers()`` returned into (optimizer, scheduler or ``None``).

    Accepts an optimizer, or Lightning's ``{"optimizer": opt, "lr_scheduler": sched}`` where
    ``sched`` is a scheduler or Lightning's scheduler dict (``{"scheduler": sched, ...}``).
    kiln steps the scheduler once per optimizer step (unlike Lightning, whose default is
    once per epoch), so a dict asking for anything else is rejected rather than ignored.

    Raises:
        TypeError: ``configured`` is neither form.
        ValueError: A scheduler dict asks for ``interval`` other than ``"step"``,
            ``frequency`` other than 1, or a key kiln does not support (``monitor``, ...).
    """
    if isinstance(configured, torch.optim.Optimizer):
        return configured, None
    config = as_dict(configured) or {}
    optimizer = config.get("optimizer")
    if isinstance(optimizer, torch.optim.Optimizer):
        scheduler = config.get("lr_scheduler")
        if isinstance(scheduler, dict):
            scheduler = _scheduler_from_dict(cast(dict[str, Any], scheduler))  # a hook's dict
        return optimizer, scheduler
    raise TypeError(
        "configure_optimizers() must return an optimizer or "
        f"{{'optimizer': opt, 'lr_scheduler': sched}}, got {type(configured).__name__}"
    )


def _scheduler_from_dict(config: dict[str, Any]) -> Any:
    supported = "kiln steps schedulers every optimizer step: interval 'step', frequency 1"
    for key, value in config.items():
        if key in _IGNORED or (key in _SUPPORTED and value == _SUPPORTED[key]):
            continue
        raise ValueError(
            f"lr_scheduler[{key!r}]={value!r} is not supported; {supported} (no 'monitor'); "
            "convert an epoch schedule to optimizer steps (module.total_steps is set)"
        )
    if "scheduler" not in config:
        raise ValueError("an lr_scheduler dict needs the scheduler under 'scheduler'")
    return config["scheduler"]
