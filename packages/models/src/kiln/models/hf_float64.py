"""transformers layers that compute in float32 whatever their input, made to compute in their
input's dtype when it is wider (float64 under ``trainer.precision=64-true``).

Llama's RMSNorm (and every RMSNorm transformers copies from it: Mistral, Qwen2, ...) casts
its input to float32, T5's layer norm takes its variance in float32, Llama's rotary
embedding computes cos/sin in float32 and its eager attention (``attn_implementation=eager``)
its softmax, so a
``64-true`` run of such a model is not all float64: its gradients stay exact only while
every scale is a power of two (a 2 -> 3 rank resume then ends 1.5e-8 away from the
uninterrupted run). :func:`compute_in_input_dtype` gives those modules a forward that
computes in ``promote_types(input dtype, float32)``: the very same ops in float32 for
float32, bf16 and fp16 inputs (so nothing changes there), float64 for float64 inputs.
An attention module keeps its own forward's code, with its global ``eager_attention_forward``
bound to :func:`eager_attention_forward` (SDPA computes in its input's dtype already).

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


def eager_attention_forward(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama's ``eager_attention_forward`` with its softmax in ``_wide(query.dtype)``."""
    from transformers.models.llama.modeling_llama import repeat_kv

    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = torch.nn.functional.softmax(attn_weights, dim=-1, dtype=_wide(query.dtype))
    attn_weights = attn_weights.to(query.dtype)
    attn_weights = torch.nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states)
    attn_output = attn_output.transpose(1, 2).contiguous()
    return attn_output, attn_weights


def _with_global(fn: Any, name: str, value: Any) -> Any:
    """A copy of ``fn`` whose global ``name`` is ``value``; a decorator's wrapper (one that
    sets ``__wrapped__``) is copied around the copy of the function it wraps."""
    wrapped = getattr(fn, "__wrapped__", None)
    inner: Any = None
    if wrapped is None:
        namespace = {**fn.__globals__, name: value}
        closure = fn.__closure__
    else:
        namespace, inner = fn.__globals__, _with_global(wrapped, name, value)
        closure = tuple(
            types.CellType(inner) if _contents(cell) is wrapped else cell
            for cell in fn.__closure__ or ()
        )
    copy = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, closure)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__dict__.update(fn.__dict__)
    copy.__qualname__ = fn.__qualname__
    if wrapped is not None:
        setattr(copy, "__wrapped__", inner)  # noqa: B010  (functools.wraps's attribute)
    return copy


def _contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def _eager_attention_replacement(cls: type) -> Callable[..., Any] | None:
    """``cls.forward`` calling :func:`eager_attention_forward` where it called a copy of
    Llama's eager attention, or ``None`` when it calls none."""
    from transformers.models.llama import modeling_llama as llama

    forward = getattr(cls, "forward", None)
    inner = getattr(forward, "__wrapped__", forward)
    code = getattr(inner, "__code__", None)
    if forward is None or inner is None or code is None:
        return None
    if "eager_attention_forward" not in code.co_names:
        return None
    eager = inner.__globals__.get("eager_attention_forward")
    if eager is None or _code(eager) != _code(llama.eager_attention_forward):
        return None
    return _with_global(forward, "eager_attention_forward", eager_attention_forward)


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
    layer norm, or calls Llama's eager attention (also as copied into other models), a
    forward that computes in its input's dtype when wider than float32. Returns the paths of
    the modules changed."""
    replacements = _replacements()
    attention: dict[type, Callable[..., Any] | None] = {}  # one copy per attention class
    changed = []
    for name, module in model.named_modules():
        code = _code(type(module).forward)
        for original, forward in replacements:
            if code is not None and code == original:
                module.forward = types.MethodType(forward, module)
                changed.append(name)
        cls = type(module)
        if cls not in attention:
            attention[cls] = _eager_attention_replacement(cls)
        replacement = attention[cls]
        if replacement is not None:
            module.forward = types.MethodType(replacement, module)
            changed.append(name)
    return changed
