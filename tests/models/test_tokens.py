"""Token losses: exact, and computed where the CPU is fast (rows of logits, no copies)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from kiln.models.data.base import IGNORE_INDEX
from kiln.models.tokens import next_token_nll, token_nll

B, L, V = 3, 12, 40


def logits_and_labels() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(B, L, V, dtype=torch.float64, generator=generator, requires_grad=True)
    labels = torch.randint(0, V, (B, L), generator=generator)
    labels[0, :3] = IGNORE_INDEX  # a row's start, as packing and padding leave it
    labels[2, -4:] = IGNORE_INDEX
    return logits, labels


class LogitsSizedOps(TorchDispatchMode):
    """The aten ops that return a tensor as large as the logits, and the log-softmax's
    inputs."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel, self.ops, self.log_softmax_inputs = numel, [], []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._log_softmax.default:
            self.log_softmax_inputs.append((args[0], args[1]))
        for tensor in out if isinstance(out, tuple | list) else [out]:
            if isinstance(tensor, torch.Tensor) and tensor.numel() >= self.numel:
                self.ops.append(func.overloadpacket.__name__)
        return out


def test_next_token_nll_equals_the_sliced_logits_loss_in_float64() -> None:
    logits, labels = logits_and_labels()
    nll, counted = next_token_nll(logits, labels)
    nll.sum().backward()
    got = logits.grad
    logits.grad = None
    want = F.cross_entropy(
        logits[:, :-1].transpose(1, 2), labels[:, 1:], ignore_index=IGNORE_INDEX, reduction="none"
    )
    want.sum().backward()
    assert nll.shape == counted.shape == (B, L - 1)
    torch.testing.assert_close(nll, want, rtol=0.0, atol=1e-12)
    assert torch.equal(counted, labels[:, 1:] != IGNORE_INDEX)
    assert (nll[~counted] == 0).all()
    torch.testing.assert_close(got, logits.grad, rtol=0.0, atol=1e-12)


@pytest.mark.parametrize("loss", [token_nll, next_token_nll])
def test_the_loss_makes_no_copy_of_the_logits(loss: Any) -> None:
    """A log-softmax over rows of contiguous logits and no logits-sized copy or slice
    gradient: on the CPU the transposed or sliced layout cost a small LM a quarter of its
    step."""
    logits, labels = logits_and_labels()
    with LogitsSizedOps(B * (L - 1) * V) as seen:
        loss(logits, labels)[0].sum().backward()
    (values, dim), *more = seen.log_softmax_inputs
    assert not more
    assert values.dim() == 2 and dim in (1, -1) and values.is_contiguous()
    allowed = {"view", "detach", "_log_softmax", "_log_softmax_backward_data", "nll_loss_backward"}
    assert set(seen.ops) <= allowed, seen.ops
