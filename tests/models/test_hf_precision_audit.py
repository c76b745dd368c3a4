"""``64-true`` means float64 for kiln.models' wrappers: kiln.core's precision audit of one
training step and its backward finds no op below float64 in any of its architectures. That
needs ``kiln.models.hf_float64``: transformers' Llama RMSNorm and rotary embedding and T5's
layer norm compute in float32 whatever their input (without it the audit names them)."""

from __future__ import annotations

import pytest

import kiln.models.hf
from kiln.core.loop.precision_audit import precision_audit
from kiln.models.testing import tiny_model

# T5's relative-position buckets are integers the model defines through float32 arithmetic
# (transformers' _relative_position_bucket); float64 could move a boundary, so they stay.
T5_BUCKETS = {"aten._to_copy", "aten.div", "aten.log", "aten.mul"}


def below_float64(name: str) -> list:
    module = tiny_model(name)
    audit = precision_audit(module, module.example_batch(2), precision="64-true")
    assert audit.dtypes().get("float64", 0) > 0
    t5 = getattr(getattr(module, "model", None), "config", None)
    t5 = getattr(t5, "model_type", None) == "t5"
    return [
        op
        for op in audit.problems()
        if not (t5 and op.module.endswith(".SelfAttention") and op.op in T5_BUCKETS)
    ]


# one model per architecture (the other registered names build these same networks)
ARCHITECTURES = ["llama-tiny-lm", "gpt2-tiny-lm", "bert-tiny-mlm", "t5-tiny-seq2seq"]
ARCHITECTURES += ["bart-tiny-seq2seq", "resnet-tiny", "vit-tiny"]


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_every_op_of_a_64_true_step_runs_in_float64(name) -> None:
    problems = below_float64(name)
    assert not problems, "\n".join(str(op) for op in problems)


def test_without_the_override_the_audit_names_llamas_norms_and_rotary(monkeypatch) -> None:
    monkeypatch.setattr(kiln.models.hf, "compute_in_input_dtype", lambda model: [])
    where = {op.module for op in below_float64("llama-tiny-lm")}
    assert "model.model.layers.0.input_layernorm" in where
    assert "model.model.layers.1.post_attention_layernorm" in where
    assert "model.model.norm" in where and "model.model.rotary_emb" in where
