"""The models of PyTorch's benchmark suites, built the way its harness builds them, no weights.

``model=bench/pt2 model.suite=hf model.arch=<name>`` (``configs/model/bench/pt2.yaml``; the sweeps
``sweep=pt2_hf``/``sweep=pt2_timm`` run a whole list) builds a :class:`SuiteModule`: a
:class:`~kiln.models.KilnModule` around the suite's model whose training step is what
PyTorch's ``benchmarks/dynamo`` harness steps, so kiln-bench's measurement (interleaved
eager/compiled steps, bootstrap interval, accuracy check, control) applies unchanged:

- **hf** (``huggingface.py``): ``getattr(transformers, name)`` built from its
  ``config_class()`` defaults (the harness's ``EXTRA_MODELS``, which it builds from hub
  configs, are written out below: no download); the harness's sequence length per family,
  random token ids (zeros for RoBERTa, EOS last for BART), ``decoder_input_ids`` for T5, MT5,
  M2M100 and Blenderbot seq2seq, and the loss arguments its class name asks for (labels,
  start/end positions); the loss is the model's own (``outputs[0]``). ``use_cache`` off.
- **timm** (``timm_models.py``): ``timm.create_model(name, pretrained=False, ...)`` with the
  harness's arguments, inputs of the model's ``input_size`` (``resolve_data_config``) drawn
  as ``randint(256)`` and standardized, seed 1337; the loss is ``reduce_to_scalar_loss``
  (the logits' mean; ``mobilevit_s`` over 1000).

Two sizes (``model.size``): ``suite`` is PyTorch's (the list's batch size over the harness's
training divisor, full configs and input sizes: a GPU's work), ``small`` the CPU variant
(:data:`SMALL_HF`, :data:`SMALL_TIMM`: 2 layers 64 wide or 2 transformer blocks, sequences
of 32 tokens or 64x64 images, batch 2), ``auto`` the first on CUDA and the second elsewhere.
A name kiln cannot build raises here; kiln-bench makes it a row with the reason.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from kiln.experiments.settings.suite_lists import source_revision, suite_batch_size, suite_list
from kiln.models import KilnModule, OptimizerConfig, SchedulerConfig
from kiln.models.module import at_least_fp32

SIZES = ("auto", "suite", "small")

SMALL_BATCH = 2
"""Batch size of the small variant (batch norm needs more than one sample in training)."""
SMALL_HF = {
    "layers": 2,
    "hidden": 64,
    "heads": 2,
    "ffn": 128,
    "vocab": 1024,
    "seq_len": 32,
}
"""The small HF variant: every layer count, width, head count and feed-forward width the
config has (under any of its names, :data:`_HF_FIELDS`) set to these, and sequences of 32."""
SMALL_TIMM = {"img_size": 64, "depth": 2}
"""The small timm variant: 64x64 images (96 for the Inception nets, which need 75), and
``depth=2`` for models that take it (ViT, DeiT, BEiT: 2 blocks); others keep their layers."""
_SMALL_TIMM_IMAGE = {"adv_inception_v3": 96, "inception_v3": 96}

_HF_FIELDS = {
    "layers": (
        "num_hidden_layers",
        "n_layer",
        "num_layers",
        "encoder_layers",
        "decoder_layers",
        "num_decoder_layers",
    ),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": (
        "num_attention_heads",
        "n_head",
        "num_heads",
        "encoder_attention_heads",
        "decoder_attention_heads",
        "attention_heads",
        "num_key_value_heads",
    ),
    "ffn": (
        "intermediate_size",
        "d_ff",
        "d_inner",
        "ffn_dim",
        "encoder_ffn_dim",
        "decoder_ffn_dim",
        "n_inner",
    ),
    "vocab": ("vocab_size",),
}
"""The names transformers configs give the dimensions :data:`SMALL_HF` sets."""

_HF_SMALL_EXTRA: dict[str, dict[str, Any]] = {
    # the widths tied to the hidden size under other names
    "Albert": {"embedding_size": 32},
    "Electra": {"embedding_size": 32},
    "MobileBert": {
        "embedding_size": 32,
        "intra_bottleneck_size": 32,
        "true_hidden_size": 32,
        "num_feedforward_networks": 2,
    },
    "YituTechConvBert": {"embedding_size": 64},
    "OPT": {"word_embed_proj_dim": 64},
    "GPTJ": {"rotary_dim": 16},
    "GPTNeo": {"attention_types": [[["global", "local"], 1]], "window_size": 16},
    "AllenaiLongformerBase": {"attention_window": 16},
    "T5": {"d_kv": 32},
    "MT5": {"d_kv": 32},
    "XLNet": {"d_head": 32},
    "TrOCR": {"cross_attention_hidden_size": 64},
}
"""Per family (name prefix), small-variant fields that must agree with :data:`SMALL_HF`."""

EXTRA_MODELS: dict[str, tuple[str, str, dict[str, Any]]] = {
    # name: (model class, config class, config values). PyTorch's harness builds these from
    # hub configs (AutoConfig.from_pretrained); their values are written out here (the
    # config classes' defaults are those models' unless set).
    "AllenaiLongformerBase": (
        "LongformerForMaskedLM",
        "LongformerConfig",
        # allenai/longformer-base-4096
        {
            "attention_window": 512,
            "max_position_embeddings": 4098,
            "vocab_size": 50265,
            "type_vocab_size": 1,
            "pad_token_id": 1,
            "bos_token_id": 0,
            "eos_token_id": 2,
            "sep_token_id": 2,
        },
    ),
    "T5Small": ("T5ForConditionalGeneration", "T5Config", {}),  # T5Config() is t5-small
    "DistillGPT2": ("GPT2LMHeadModel", "GPT2Config", {"n_layer": 6}),  # distilgpt2
    "GoogleFnet": ("FNetForMaskedLM", "FNetConfig", {}),  # FNetConfig() is google/fnet-base
    "YituTechConvBert": ("ConvBertForMaskedLM", "ConvBertConfig", {}),  # conv-bert-base
    # not in the harness's EXTRA_MODELS at the revision read (getattr(transformers,
    # "CamemBert") fails there too): kiln builds camembert-base's masked LM
    "CamemBert": (
        "CamembertForMaskedLM",
        "CamembertConfig",
        {"vocab_size": 32005, "pad_token_id": 1, "bos_token_id": 5, "eos_token_id": 6},
    ),
}
"""The list's names that are no transformers class, as PyTorch's harness maps them."""

_PAD_ZERO = ("GPT2ForSequenceClassification", "GPTNeoForSequenceClassification", "Roberta")
"""The harness sets ``pad_token_id = 0`` for these (batches of more than one need it)."""
_DECODER_INPUTS = ("T5", "M2M100", "MT5", "BlenderbotForConditionalGeneration")
"""The harness passes ``decoder_input_ids = input_ids`` to these."""

_SEQ_LENGTHS: tuple[tuple[tuple[str, ...], int], ...] = (
    # huggingface.py get_sequence_length, in its order (first match wins)
    (("Blenderbot",), 128),
    (("GPT2", "Bart", "T5", "PLBart", "MBart"), 1024),
    (("AllenaiLongformerBase", "BigBird"), 1024),
    (("OPT",), 2048),
    (
        (
            "Albert",
            "Deberta",
            "Layout",
            "Electra",
            "XLNet",
            "MegatronBert",
            "Bert",
            "Roberta",
            "DistillGPT2",
            "GoogleFnet",
            "YituTechConvBert",
        ),
        512,
    ),
    (("TrOCRForCausalLM",), 256),
    (("MobileBert",), 128),
)
_DEFAULT_SEQ_LENGTH = 128


class SuiteModelUnsupported(ValueError):
    """A name of PyTorch's list that kiln-bench does not build (the reason says why)."""


def resolve_size(size: str, device: torch.device) -> str:
    """``suite`` or ``small`` for ``model.size`` on ``device`` (``auto``: suite on CUDA)."""
    if size not in SIZES:
        raise ValueError(f"model.size={size!r} is not valid; choose one of: {', '.join(SIZES)}")
    if size == "auto":
        return "suite" if device.type == "cuda" else "small"
    return size


class SuiteModule(KilnModule):
    """One suite model and its fixed batch, under kiln's module contract (benchmarks only).

    Args:
        model: The transformers or timm model.
        suite: ``hf`` or ``timm``.
        arch: The list's name.
        size: ``suite`` or ``small`` (resolved).
        batch_size: The batch ``example_batch()`` draws by default.
        seq_len: Tokens per sequence (hf) or ``None``.
        input_size: ``(C, H, W)`` (timm) or ``None``.
        optimizer: Optimizer settings (kiln's AdamW, as kiln-train would step).
        scheduler: Schedule settings.
    """

    task = "benchmark"
    metric_keys = ("loss",)

    def __init__(
        self,
        model: nn.Module,
        *,
        suite: str,
        arch: str,
        size: str,
        batch_size: int,
        seq_len: int | None = None,
        input_size: tuple[int, int, int] | None = None,
        optimizer: OptimizerConfig | None = None,
        scheduler: SchedulerConfig | None = None,
    ) -> None:
        super().__init__(data=None, optimizer=optimizer, scheduler=scheduler)
        self.model = model
        self.suite, self.arch, self.size = suite, arch, size
        self.default_batch_size = batch_size
        self.seq_len, self.input_size = seq_len, input_size

    def describe(self) -> dict[str, Any]:
        """What the benchmark record says about the model (suite, size, shapes, source)."""
        return {
            "suite": self.suite,
            "suite_size": self.size,
            "suite_source": source_revision(self.suite),
            "seq_len": self.seq_len,
            "input_size": list(self.input_size) if self.input_size else None,
            "parameters": sum(p.numel() for p in self.model.parameters()),
        }

    def loss_and_count(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
        if self.suite == "hf":
            loss = self.model(**batch)[0]  # the harness's compute_loss: pred[0]
        else:
            pred = self.model(batch["pixel_values"])
            pred = pred[0] if isinstance(pred, tuple) else pred
            loss = pred.sum() / pred.numel()  # torch._dynamo.testing.reduce_to_scalar_loss
            if self.arch == "mobilevit_s":
                loss = loss / 1000.0  # the harness's scaled_compute_loss
        first = next(iter(batch.values()))
        return at_least_fp32(loss), int(first.shape[0])

    def count_items(self, batch: dict[str, torch.Tensor]) -> int:
        return int(next(iter(batch.values())).shape[0])

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict:
        """The batch's loss (kiln-bench never validates; the contract asks for one)."""
        loss, _ = self.loss_and_count(batch)
        return {"loss": loss.detach().reshape(1)}

    def validation_metrics(self, outputs: dict[str, torch.Tensor]) -> dict[str, float]:
        return {"loss": float(outputs["loss"].float().mean())}

    def example_batch(
        self, batch_size: int | None = None, device: torch.device | str | None = None
    ) -> dict[str, torch.Tensor]:
        """The harness's inputs for this model (seeded: the same batch every call)."""
        n = batch_size or self.default_batch_size
        gen = torch.Generator().manual_seed(1337)
        batch = (
            hf_inputs(self.model, self.arch, n, self.seq_len, gen)
            if self.suite == "hf"
            else (timm_inputs(n, self.input_size, gen))
        )
        return {k: v.to(device) for k, v in batch.items()} if device is not None else batch


def build_suite_module(
    model_cfg: dict[str, Any],
    device: torch.device,
    optimizer: OptimizerConfig | None = None,
    scheduler: SchedulerConfig | None = None,
) -> SuiteModule:
    """The :class:`SuiteModule` of a ``model=bench/pt2`` config (``suite``, ``arch``, ``size``).

    Raises:
        ValueError: Unknown suite, size or name (naming the valid ones).
        SuiteModelUnsupported: A name kiln-bench does not build, with the reason.
    """
    unknown = set(model_cfg) - {"name", "suite", "arch", "size"}
    if unknown:
        raise ValueError(
            f"model=bench/pt2 has no argument(s) {sorted(unknown)}; valid: suite, arch, size"
        )
    suite, arch = str(model_cfg.get("suite", "hf")), str(model_cfg.get("arch", ""))
    suite_list(suite)
    size = resolve_size(str(model_cfg.get("size", "auto")), device)
    listed = suite_batch_size(suite, arch)  # also refuses a name that is not in the list
    batch = listed if size == "suite" else SMALL_BATCH
    seq_len, input_size = None, None
    if suite == "hf":
        model, seq_len = build_hf(arch, size)
    else:
        model, input_size = build_timm(arch, size)
    return SuiteModule(
        model,
        suite=suite,
        arch=arch,
        size=size,
        batch_size=batch,
        seq_len=seq_len,
        input_size=input_size,
        optimizer=optimizer,
        scheduler=scheduler,
    )


# -- HuggingFace ----------------------------------------------------------------------------
def hf_sequence_length(name: str) -> int:
    """The harness's sequence length for ``name`` (``get_sequence_length``)."""
    for prefixes, length in _SEQ_LENGTHS:
        if name.startswith(prefixes) or name in prefixes:
            return length
    return _DEFAULT_SEQ_LENGTH


def _hf_classes(name: str) -> tuple[type, Any]:
    """The model class and its config (with the harness's settings) for a list name."""
    import transformers

    if "/" in name:
        raise SuiteModelUnsupported(
            "an LLM entry of the harness (huggingface_llm_models.py: pretrained hub weights, "
            "timed on generate() for inference); not built without a download"
        )
    if name in EXTRA_MODELS:
        cls_name, config_name, values = EXTRA_MODELS[name]
        return getattr(transformers, cls_name), getattr(transformers, config_name)(**values)
    cls = getattr(transformers, name, None)
    if cls is None or not hasattr(cls, "config_class"):
        raise SuiteModelUnsupported(
            f"transformers {transformers.__version__} has no model class {name!r}"
        )
    config = cls.config_class()
    if name.startswith(_PAD_ZERO):
        config.pad_token_id = 0
    return cls, config


def shrink_hf_config(name: str, config: Any) -> Any:
    """``config`` made the small variant (:data:`SMALL_HF`), in place; returns it."""
    for key, names in _HF_FIELDS.items():
        for field_name in names:
            if getattr(config, field_name, None) is not None:
                setattr(config, field_name, SMALL_HF[key])
    for prefix, values in _HF_SMALL_EXTRA.items():
        if name.startswith(prefix):
            for key, value in values.items():
                setattr(config, key, value)
    if getattr(config, "max_position_embeddings", None):
        try:
            config.max_position_embeddings = max(SMALL_HF["seq_len"] * 4, 128)
        except NotImplementedError:  # XLNet: no position limit, and its config says so
            pass
    _clamp_special_tokens(config)
    return config


def _clamp_special_tokens(config: Any) -> None:
    """Special token ids of the full vocabulary moved inside the small one."""
    for token in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        value = getattr(config, token, None)
        if isinstance(value, int) and value >= SMALL_HF["vocab"]:
            setattr(config, token, SMALL_HF["vocab"] - 1)


def build_hf(name: str, size: str) -> tuple[nn.Module, int]:
    """The transformers model for list name ``name`` at ``size``, and its sequence length."""
    cls, config = _hf_classes(name)
    seq_len = hf_sequence_length(name)
    if size == "small":
        shrink_hf_config(name, config)
        seq_len = SMALL_HF["seq_len"]
    if hasattr(config, "use_cache"):
        config.use_cache = False  # as the harness: no KV cache in training
    model = cls.from_config(config) if "auto" in cls.__module__ else cls(config)
    return model, seq_len


def hf_inputs(
    model: nn.Module, name: str, n: int, seq_len: int | None, gen: torch.Generator
) -> dict[str, torch.Tensor]:
    """The harness's ``generate_inputs_for_model`` (with loss arguments) for ``name``."""
    assert seq_len is not None
    config = model.config
    vocab = config.vocab_size

    def ints(high: int, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randint(0, high, shape, generator=gen, dtype=torch.int64)

    ids = (
        torch.zeros(n, seq_len, dtype=torch.int64)
        if name.startswith("Roberta")
        else (ints(vocab, (n, seq_len)))
    )
    if "Bart" in name:
        ids[:, -1] = config.eos_token_id
    batch = {"input_ids": ids}
    if name.startswith(_DECODER_INPUTS):
        batch["decoder_input_ids"] = ids
    if name.endswith("QuestionAnswering"):
        batch["start_positions"] = ints(seq_len, (n,))
        batch["end_positions"] = ints(seq_len, (n,))
    elif name.endswith(("MaskedLM", "HeadModel", "CausalLM", "DoubleHeadsModel")):
        batch["labels"] = ints(vocab, (n, seq_len))
    elif name.endswith("SequenceClassification"):
        batch["labels"] = ints(max(config.num_labels - 1, 1), (n,))
    elif name.endswith("ForConditionalGeneration"):
        batch["labels"] = ints(vocab - 1, (n, seq_len))
    elif name in EXTRA_MODELS:
        batch["labels"] = ints(vocab, (n, seq_len))
    else:
        raise SuiteModelUnsupported(f"no training inputs for {name!r} (the harness has none)")
    return batch


# -- timm -----------------------------------------------------------------------------------
def build_timm(name: str, size: str) -> tuple[nn.Module, tuple[int, int, int]]:
    """The timm model for ``name`` at ``size`` (random init) and its input size ``(C, H, W)``.

    The small variant tries ``img_size`` and ``depth`` (:data:`SMALL_TIMM`), then only
    ``img_size``, then neither (a convnet takes any image size without being told).
    """
    import timm
    from timm.data.config import resolve_data_config

    harness_kwargs = {
        "in_chans": 3,
        "scriptable": False,
        "num_classes": None,
        "drop_rate": 0.0,
        "drop_path_rate": None,
        "drop_block_rate": None,
        "pretrained": False,
    }
    if size == "suite":
        model = timm.create_model(name, **harness_kwargs)
        input_size = tuple(resolve_data_config({}, model=model)["input_size"])
        return model, input_size  # type: ignore[return-value]
    image = _SMALL_TIMM_IMAGE.get(name, SMALL_TIMM["img_size"])
    tries = (
        {"img_size": image, "depth": SMALL_TIMM["depth"]},
        {"img_size": image},
        {},
    )
    error: Exception | None = None
    for extra in tries:
        try:
            model = timm.create_model(name, **harness_kwargs, **extra)
        except TypeError as exc:  # the model takes no such argument: try fewer
            error = exc
            continue
        return model, (3, image, image)
    raise SuiteModelUnsupported(f"timm could not build a small {name}: {error}")


def timm_inputs(
    n: int, input_size: tuple[int, int, int] | None, gen: torch.Generator
) -> dict[str, torch.Tensor]:
    """The harness's image batch: ``randint(256)`` pixels, standardized."""
    assert input_size is not None
    pixels = torch.randint(256, (n, *input_size), generator=gen).to(torch.float32)
    return {"pixel_values": (pixels - pixels.mean()) / pixels.std()}
