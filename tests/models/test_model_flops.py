"""FLOPs counted on meta tensors match a count of the real step (FlopCounterMode on a copy
of the module, real weights and the real batch, attention mask included)."""

import copy

import pytest
from torch.utils.flop_counter import FlopCounterMode

from kiln.core import TrainerConfig, fit
from kiln.core.telemetry.flops import count_micro_batch_flops
from kiln.models.testing import tiny_model


def _real_step_flops(module, batch) -> int:
    counter = FlopCounterMode(display=False)
    with counter:
        out = copy.deepcopy(module).training_step(batch, 0)
        out["loss"].backward()
    return counter.get_total_flops()


@pytest.mark.parametrize(
    ("name", "rel"),
    [("bert-tiny-cls", 0.0), ("minilm-cls", 0.0), ("llama-tiny-lm", 1e-3), ("resnet-tiny", 0.0)],
)
def test_meta_count_matches_the_real_step(name, rel):
    """HF models read ``attention_mask.all()`` in their SDPA path (no value on meta): their
    ``flops_batch`` hook counts without the mask. BERT's matmuls are the same; Llama builds
    its causal mask with a few more ops when given one (under 0.1%)."""
    module = tiny_model(name, data=True)
    batch = next(iter(module.data_module.train_dataloader()))
    counted = count_micro_batch_flops(module, batch)
    assert counted is not None, f"{name}: FLOPs not counted"
    assert counted == pytest.approx(_real_step_flops(module, batch), rel=rel, abs=0)


@pytest.mark.parametrize("name", ["llama-tiny-lm", "bert-tiny-cls"])
def test_activation_checkpointing_reports_the_same_flops(name):
    """Recomputation adds no model FLOPs: a fit with ``trainer.activation_checkpointing``
    reports the ``flops_per_step`` of one without (transformers' checkpointed forward reads
    position values, which the meta count cannot: kiln counts with checkpointing paused)."""
    flops = {}
    for checkpointed in (False, True):
        trainer = TrainerConfig(
            max_steps=1, accelerator="cpu", progress=False, limit_val_batches=1,
            activation_checkpointing=checkpointed,
        )  # fmt: skip
        telemetry = fit(tiny_model(name, data=True), trainer).telemetry
        assert (telemetry["activation_checkpointing"] is not None) == checkpointed
        flops[checkpointed] = telemetry["flops_per_step"]
    assert flops[True] is not None and flops[True] == flops[False]


def test_a_timm_model_reports_its_flops_under_64_true():
    """A float32 image batch meets ViT's float64 patch convolution (with a bias, which the
    meta pass checks): the count converts the batch, as Fabric converts the real step's."""
    flops = {}
    for precision in ("32-true", "64-true"):
        trainer = TrainerConfig(
            max_steps=1, accelerator="cpu", progress=False, limit_val_batches=1,
            precision=precision,
        )  # fmt: skip
        telemetry = fit(tiny_model("vit-tiny", data=True), trainer).telemetry
        flops[precision] = telemetry["flops_per_step"]
    assert flops["64-true"] is not None and flops["64-true"] == flops["32-true"]
