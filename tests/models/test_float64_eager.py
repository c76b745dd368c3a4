"""``64-true`` is float64 with ``attn_implementation=eager`` too: transformers' Llama eager
attention takes its softmax in float32 whatever its input; ``kiln.models.hf_float64`` gives
it the input's dtype when wider (float64), and changes nothing in float32."""

from __future__ import annotations

import pytest
import torch

import kiln.models.hf
from kiln.core.loop.precision_audit import precision_audit
from kiln.models.testing import tiny_model


def test_eager_llama_step_runs_every_op_in_float64() -> None:
    module = tiny_model("llama-tiny-lm", attn_implementation="eager")
    assert module.model.config._attn_implementation == "eager"
    audit = precision_audit(module, module.example_batch(2), precision="64-true")
    assert audit.dtypes().get("float64", 0) > 0
    problems = audit.problems()
    assert not problems, "\n".join(str(op) for op in problems)


def step(module, batch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    loss = module.training_step(batch, 0)["loss"]
    loss.backward()
    return loss.detach(), [p.grad for p in module.parameters()]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_the_override_changes_nothing_in_float32(monkeypatch, attn) -> None:
    """The same loss and gradients, bit for bit, as transformers' own float32 forwards."""
    torch.manual_seed(0)
    ours = tiny_model("llama-tiny-lm", attn_implementation=attn)
    monkeypatch.setattr(kiln.models.hf, "compute_in_input_dtype", lambda model: [])
    torch.manual_seed(0)
    theirs = tiny_model("llama-tiny-lm", attn_implementation=attn)
    batch = ours.example_batch(2)
    loss, grads = step(ours, batch)
    want_loss, want_grads = step(theirs, batch)
    assert torch.equal(loss, want_loss)
    assert all(torch.equal(a, b) for a, b in zip(grads, want_grads, strict=True))


def test_eager_attention_is_replaced_in_every_layer() -> None:
    from kiln.models.hf_float64 import compute_in_input_dtype

    module = tiny_model("llama-tiny-lm", attn_implementation="eager")
    changed = compute_in_input_dtype(module.model)
    assert "model.layers.0.self_attn" in changed and "model.layers.1.self_attn" in changed
