"""Every optimizer step's gradients, recorded by a fit callback, and their comparison: the
activation-checkpointing tests of kiln.core and kiln.models compare a run with it to one
without it."""

from __future__ import annotations

import torch


class Grads:
    """Records every step's gradients by parameter name, before the optimizer step (this
    rank's shard under FSDP); ``strip`` is removed from the names (a wrapper's prefix)."""

    def __init__(self, module: torch.nn.Module, strip: str = "") -> None:
        self.module, self.strip, self.steps = module, strip, []

    def on_before_optimizer_step(self, optimizer) -> None:
        named = self.module.named_parameters()
        self.steps.append({n.replace(self.strip, ""): local(p.grad) for n, p in named})


def local(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of this rank's shard (FSDP's DTensor gradients), or of the tensor."""
    to_local = getattr(tensor, "to_local", None)
    return (to_local() if callable(to_local) else tensor).clone()


def assert_same_steps(got: list[dict], want: list[dict], steps: int) -> None:
    """``steps`` steps in each, with the same parameters and gradients within 1e-12."""
    assert len(got) == len(want) == steps
    for step, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.keys() == b.keys()
        for name in a:
            torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-12, msg=f"{step} {name}")
