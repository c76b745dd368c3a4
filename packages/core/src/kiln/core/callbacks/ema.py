"""An exponential moving average of the weights, validated with and checkpointed."""

from __future__ import annotations

from typing import Any

import torch

_COMPILED_PREFIX = "_orig_mod."


class EMA:
    """Keep ``ema = decay * ema + (1 - decay) * weights`` after every optimizer step.

    The average starts from the weights at the start of the run and covers the trainable
    parameters (buffers such as BatchNorm statistics stay the model's own). It is kept in
    at least float32 (float64 under ``64-true``) on the parameters' device and updated with
    one fused ``torch._foreach_lerp_`` per step, without a host sync. With
    ``validate_with_ema`` the averaged weights are copied into the model for each validation
    (so ``val/`` metrics, and what ``EarlyStopping``/``BestCheckpoint`` see, are the
    average's) and the trained weights are put back afterwards. Checkpoints keep the trained
    weights under ``"model"`` and the average under ``["callbacks"]["EMA"]["weights"]``
    (parameter name -> tensor, loadable with ``module.load_state_dict(..., strict=False)``);
    a resumed run's average equals that of an uninterrupted one. One process per device
    (single device or DDP); sharded strategies are not supported.

    Args:
        decay: Weight of the old average at each update, in [0, 1).
        validate_with_ema: Validate with the averaged weights.
        every_n_steps: Update after every n-th optimizer step only (>= 1).
    """

    def __init__(
        self, decay: float = 0.999, validate_with_ema: bool = True, every_n_steps: int = 1
    ) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA: decay={decay} is not valid; use 0 <= decay < 1")
        if every_n_steps < 1:
            raise ValueError(f"EMA: every_n_steps={every_n_steps} is not valid; use >= 1")
        self.decay, self.validate_with_ema, self.every_n_steps = (
            decay,
            validate_with_ema,
            every_n_steps,
        )
        self._fit: Any = None
        self._names: list[str] = []
        self._params: list[torch.Tensor] = []
        self._shadow: list[torch.Tensor] | None = None
        self._loaded: dict[str, torch.Tensor] | None = None  # restored before the run starts
        self._backup: list[torch.Tensor] | None = None
        self._last_step = 0

    def on_loop_start(self, fit: Any) -> None:
        self._fit, self._last_step = fit, fit.global_step
        named = [(n, p) for n, p in fit.module.named_parameters() if p.requires_grad]
        if any(type(p).__name__ == "DTensor" for _, p in named):
            # each rank holds a shard, and the callback's state is saved from rank 0 only
            raise ValueError(
                "the EMA callback averages whole parameters on one device or under DDP; "
                "trainer.strategy=fsdp shards them: drop the callback or use trainer.strategy=ddp"
            )
        self._names = [n.replace(_COMPILED_PREFIX, "") for n, _ in named]
        self._params = [p for _, p in named]
        if self._loaded is not None:
            self._restore(self._loaded)
        else:
            self._shadow = [p.detach().to(_average_dtype(p), copy=True) for p in self._params]

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = self._fit.global_step
        # called per micro-batch: only the window's last one follows an optimizer step
        if step != self._last_step and step % self.every_n_steps == 0:
            self._last_step = step
            self.update()

    @torch.no_grad()
    def update(self) -> None:
        """Move the average towards the current weights by ``1 - decay``."""
        shadow = self._require_shadow()
        current = [p.detach().to(s.dtype) for p, s in zip(self._params, shadow, strict=True)]
        # one fused op over all tensors; torch gives it no public name
        torch._foreach_lerp_(shadow, current, 1.0 - self.decay)  # pyright: ignore[reportPrivateUsage, reportPrivateImportUsage]

    @torch.no_grad()
    def on_validation_start(self) -> None:
        if self.validate_with_ema and self._shadow is not None:
            self._backup = [p.detach().clone() for p in self._params]
            _copy(self._params, self._shadow)

    @torch.no_grad()
    def on_validation_end(self) -> None:
        if self._backup is not None:
            _copy(self._params, self._backup)
            self._backup = None

    def weights(self) -> dict[str, torch.Tensor]:
        """The averaged weights by parameter name (copies)."""
        shadow = self._require_shadow()
        return {n: s.detach().clone() for n, s in zip(self._names, shadow, strict=True)}

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "weights": self.weights()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._loaded = dict(state["weights"])
        if self._params:  # the run has started: restore now, else at on_loop_start
            self._restore(self._loaded)

    def _restore(self, saved: dict[str, torch.Tensor]) -> None:
        if list(saved) != self._names:
            missing = [n for n in self._names if n not in saved]
            unexpected = [n for n in saved if n not in self._names]
            raise RuntimeError(
                "EMA: the saved average does not match the model's trainable parameters "
                f"(missing: {missing[:5]}, unexpected: {unexpected[:5]})"
            )
        self._shadow = [
            saved[n].to(p.device, _average_dtype(p), copy=True)
            for n, p in zip(self._names, self._params, strict=True)
        ]
        self._loaded = None

    def _require_shadow(self) -> list[torch.Tensor]:
        if self._shadow is None:
            raise RuntimeError("EMA: the average starts with the run (on_loop_start)")
        return self._shadow


def _average_dtype(param: torch.Tensor) -> torch.dtype:
    # bf16/fp16 weights average in fp32 (their own rounding would swallow small updates)
    return torch.promote_types(param.dtype, torch.float32)


def _copy(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    for target, source in zip(targets, sources, strict=True):
        target.copy_(source)
