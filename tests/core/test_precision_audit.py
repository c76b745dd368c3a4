"""The precision audit (``kiln.core.loop.precision_audit``, ``trainer.precision_audit``): which ops
a training step and its backward ran in which dtype, and in which module. Under ``64-true``
it names an op that ran below float64 and its module path; under ``bf16-mixed`` it shows
the linear layers' matmuls ran in bf16, forward and backward (float32 without autocast)."""

from __future__ import annotations

import torch
from toy import ToyBlocksModule

from kiln.core import TrainerConfig, fit
from kiln.core.loop.precision_audit import precision_audit


class Float32Norm(torch.nn.Module):
    """Computes in float32 whatever its input, as transformers' Llama RMSNorm does."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = h.to(torch.float32)
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)).to(h.dtype)


class NormedBlocks(ToyBlocksModule):
    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.norm = Float32Norm()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.embed(input_ids))
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


def batch(module: ToyBlocksModule) -> dict[str, torch.Tensor]:
    return next(iter(module.train_dataloader()))


def test_64_true_names_each_op_below_float64_and_its_module() -> None:
    module = NormedBlocks()
    audit = precision_audit(module, batch(module), precision="64-true")
    below = audit.problems()
    assert {op.module for op in below} == {"norm"}, str(audit)
    assert {"aten.pow", "aten.mean", "aten.rsqrt"} <= {op.op for op in below if not op.backward}
    assert any(op.backward for op in below)  # its backward ran in float32 too
    assert "norm: aten.rsqrt in float32 (forward, x1)" in str(audit)
    # the module itself is left as it was: float32, no gradients
    assert all(p.dtype == torch.float32 and p.grad is None for p in module.parameters())


def test_64_true_without_such_a_layer_is_all_float64() -> None:
    module = ToyBlocksModule()
    audit = precision_audit(module, batch(module), precision="64-true")
    assert audit.problems() == [] and set(audit.dtypes()) == {"float64"}
    assert audit.dtypes(matmuls_only=True)["float64"] > 0


def test_bf16_mixed_runs_the_linear_matmuls_in_bf16_forward_and_backward() -> None:
    module = ToyBlocksModule()
    mixed = precision_audit(module, batch(module), precision="bf16-mixed")
    linear = [op for op in mixed.ops if op.op in ("aten.addmm", "aten.mm")]
    assert {op.dtype for op in linear} == {"bfloat16"}, str(mixed)
    assert {op.backward for op in linear} == {False, True}
    assert {op.module for op in linear} >= {"blocks.0.linear", "blocks.1.linear", "head"}
    plain = precision_audit(module, batch(module), precision="32-true")
    assert set(plain.dtypes(matmuls_only=True)) == {"float32"}


def test_fit_audits_its_first_step_into_the_telemetry() -> None:
    trainer = TrainerConfig(
        max_steps=2, accelerator="cpu", precision="64-true", progress=False, precision_audit=True
    )
    record = fit(NormedBlocks(), trainer).telemetry["precision_audit"]
    assert record["precision"] == "64-true" and record["not_as_precision_says"] > 0
    assert any(example.startswith("norm: ") for example in record["examples"])
    assert record["matmuls_by_dtype"] == {"float64": record["matmuls_by_dtype"]["float64"]}
    clean = fit(ToyBlocksModule(), trainer).telemetry["precision_audit"]
    assert clean["not_as_precision_says"] == 0 and clean["examples"] == []
    assert (
        "precision_audit"
        not in fit(
            ToyBlocksModule(), TrainerConfig(max_steps=1, accelerator="cpu", progress=False)
        ).telemetry
    )
