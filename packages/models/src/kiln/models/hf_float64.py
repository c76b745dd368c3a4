"""transformers layers that compute in float32 whatever their input, made to compute in their
input's dtype when it is wider (float64 under ``trainer.precision=64-true``).

Llama's RMSNorm (and every RMSNorm transformers copies from it: Mistral, Qwen2, ...) casts
its input to float32, T5's layer norm takes its variance in float32, and Llama's rotary
embedding computes cos/sin in float32, so a
``64-true`` run of such a model is not all float64: its gradients stay exact only while
every scale is a power of two (a 2 -> 3 rank resume then ends 1.5e-8 away from the
uninterrupted run). :func:`compute_in_input_dtype` gives those modules a forward that
computes in ``promote_types(input dtype, float32)``: the very same ops in float32 for
float32, bf16 and fp16 inputs (so nothing changes there), float64 for float64 inputs.

Only forwards whose code is exactly transformers' Llama ones are replaced (another
model's variant keeps its own); ``kiln.core``'s precision audit
(``trainer.precision_audit=true``) names any op that still runs below float64.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch


def _wide(dtype: torch.dtype) -> torch.dtype:
    """At least float32, the input's dtype when it is wider."""
    return torch.promote_types(dtype, torch.float32)


def rms_norm_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """``LlamaRMSNorm.forward`` computing in ``_wide(input dtype)`` (float32 in transformers)."""
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(_wide(input_dtype))
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states.to(input_dtype)


def t5_layer_norm_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """``T5LayerNorm.forward`` with its variance in ``_wide(input dtype)`` (float32 in
    transformers)."""
    variance = hidden_states.to(_wide(hidden_states.dtype)).pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    if self.weight.dtype in [torch.float16, torch.bfloat16]:
        hidden_states = hidden_states.to(self.weight.dtype)
    return self.weight * hidden_states


def rotary_forward(
    self: Any, x: torch.Tensor, position_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``LlamaRotaryEmbedding.forward`` computing cos/sin in ``_wide(x.dtype)``."""
    dtype = _wide(x.dtype)
    freqs = position_ids[..., None].to(dtype) * self.inv_freq.to(device=x.device, dtype=dtype)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos() * self.attention_scaling
    sin = emb.sin() * self.attention_scaling
    return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def _code(fn: Any) -> tuple[Any, ...] | None:
    """What identifies a function's behaviour: its bytecode, constants and names."""
    fn = getattr(fn, "__wrapped__", fn)  # rotary's forward is wrapped (dynamic_rope_update)
    code = getattr(fn, "__code__", None)
    return None if code is None else (code.co_code, code.co_consts, code.co_names)


def _replacements() -> list[tuple[tuple[Any, ...] | None, Callable[..., Any]]]:
    """(the code of a transformers forward, the forward that replaces it)."""
    from transformers.modeling_rope_utils import dynamic_rope_update
    from transformers.models.llama import modeling_llama as llama
    from transformers.models.t5 import modeling_t5 as t5

    return [
        (_code(llama.LlamaRMSNorm.forward), rms_norm_forward),
        (_code(t5.T5LayerNorm.forward), t5_layer_norm_forward),
        (_code(llama.LlamaRotaryEmbedding.forward), dynamic_rope_update(rotary_forward)),
    ]


def compute_in_input_dtype(model: torch.nn.Module) -> list[str]:
    """Give every submodule whose forward is Llama's RMSNorm or rotary embedding or T5's
    layer norm (also as copied into other models) a forward that computes in its input's
    dtype when wider than float32. Returns the paths of the modules changed."""
    replacements = _replacements()
    changed = []
    for name, module in model.named_modules():
        code = _code(type(module).forward)
        for original, forward in replacements:
            if code is not None and code == original:
                module.forward = types.MethodType(forward, module)
                changed.append(name)
    return changed
