"""kiln's model test kit: the checks every registered model passes, one function each.

``test_models.py`` and ``test_fit.py`` run them over ``list_models()`` (kiln's models and
every installed plugin's); a plugin's own test can call them on its model (``run_kit``).
Each model supplies what a check needs: its tiny variant (``tiny`` in the registry), its
tiny data (``tiny_data()``), its metric keys (``metric_keys``) and its export.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

import kiln.models as km
from kiln.core import TrainerConfig, fit, precision_audit


def model_class(name: str) -> type:
    """The class ``create_model(name)`` builds (its tiny variant, built once to see)."""
    return type(km.create_model(name, tiny=True))


def tiny_model(name: str, data: Any = None, **kwargs: Any) -> Any:
    """The registered model ``name`` at its test size; ``data=True`` adds its tiny data."""
    entry = km.get_model_entry(name)
    if data is True:
        kwargs["data"] = model_class(name).tiny_data()
    elif data is not None:
        kwargs["data"] = data
    return km.create_model(name, **{**entry.tiny, **kwargs})


def _trainer(**kwargs: Any) -> TrainerConfig:
    base = dict(max_steps=1, accelerator="cpu", limit_val_batches=1, progress=False)
    return TrainerConfig(**{**base, **kwargs})


def check_forward_backward_and_validation(name: str) -> None:
    """A finite loss with its item count, finite non-zero gradients, per-sample validation
    outputs and exactly the model's ``metric_keys`` as floats."""
    module = tiny_model(name)
    batch = module.example_batch(4)
    out = module.training_step(batch, 0)
    assert out["loss"].ndim == 0 and torch.isfinite(out["loss"])
    assert int(out["num_items"]) == int(module.count_items(batch)) > 0
    out["loss"].backward()
    grads = [p.grad for p in module.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0
    module.eval()
    with torch.no_grad():
        outputs = module.validation_step(batch, 0)
    assert all(v.shape[0] == 4 for v in outputs.values())  # per-sample, batch-first
    metrics = module.validation_metrics(outputs)
    assert set(metrics) == set(module.metric_keys), (sorted(metrics), module.metric_keys)
    assert all(isinstance(v, float) for v in metrics.values())


DENSE_OPS = {"aten.mm", "aten.addmm", "aten.convolution", "aten.convolution_backward"}
"""The matmuls of the weight-holding layers (linear, convolution): the bulk of the FLOPs."""


def check_bf16_mixed(name: str) -> None:
    """Under bf16-mixed, run as kiln.core runs it (Fabric's autocast), every linear and
    convolution matmul of the forward and of the backward runs in bf16: the precision audit
    sees the dtypes the ops really ran in (below autocast), not the float32 loss and
    gradients autocast returns. Attention's batched matmuls may run in float32: torch's
    SDPA math kernel (the CPU's, with a mask) computes bf16 inputs in float32."""
    module = tiny_model(name)
    audit = precision_audit(module, module.example_batch(2), precision="bf16-mixed")
    dense = [op for op in audit.ops if op.op in DENSE_OPS]
    assert any(op.backward for op in dense) and any(not op.backward for op in dense), audit
    assert all(op.dtype == "bfloat16" for op in dense), str(audit)
    assert audit.dtypes(matmuls_only=True).get("bfloat16", 0) > 0


def check_checkpoint_round_trip(name: str, tmp_path: Path) -> None:
    """Trained one step by ``kiln.core.fit`` and resumed from its checkpoint into a
    differently initialized model, it validates exactly as the trained one."""
    trainer = dict(max_steps=1, accelerator="cpu", limit_val_batches=1, progress=False)
    torch.manual_seed(0)
    trained = tiny_model(name, data=True)
    saved = fit(trained, trainer=TrainerConfig(**trainer, checkpoint_dir=str(tmp_path)))
    assert saved.checkpoint is not None and saved.global_step == 1
    torch.manual_seed(1)  # a different random init, overwritten by the load
    loaded = tiny_model(name, data=True)
    before = {k: v.detach().clone() for k, v in loaded.state_dict().items()}
    assert any(not torch.equal(v, before[k]) for k, v in trained.state_dict().items())
    resumed = fit(loaded, trainer=TrainerConfig(**trainer, resume=saved.checkpoint))
    assert resumed.global_step == 1  # loaded at step 1 of 1: nothing more to train
    trained.eval(), loaded.eval()
    batch = trained.example_batch(2)
    with torch.no_grad():
        expected, actual = trained.validation_step(batch, 0), loaded.validation_step(batch, 0)
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key])


def check_no_graph_breaks(name: str) -> None:
    """The training step compiles as one graph."""
    module = tiny_model(name)
    batch = module.example_batch(2)
    explanation = torch._dynamo.explain(lambda b: module.training_step(b, 0)["loss"])(batch)
    reasons = [str(r.reason) for r in explanation.break_reasons]
    assert explanation.graph_break_count == 0, f"{name} graph breaks: {reasons}"


def check_inductor_matches_eager(name: str) -> None:
    """Inductor's fullgraph validation step computes what eager does."""
    torch.compiler.reset()
    module = tiny_model(name).eval()  # eval: no dropout, so eager and compiled agree
    batch = module.example_batch(2)
    compiled = torch.compile(
        lambda b: module.validation_step(b, 0), backend="inductor", fullgraph=True
    )
    with torch.no_grad():
        expected, actual = module.validation_step(batch, 0), compiled(batch)
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=1e-4, atol=1e-4)


def check_fit_step(name: str) -> None:
    """One optimizer step through ``kiln.core.fit`` on the model's tiny data changes the
    weights and validates to every one of its ``metric_keys``."""
    module = tiny_model(name, data=True)
    before = {k: v.detach().clone() for k, v in module.named_parameters()}
    result = fit(module, trainer=_trainer())
    assert result.global_step == 1
    changed = [k for k, v in module.named_parameters() if not torch.equal(v, before[k])]
    assert changed, "the optimizer step changed no parameter"
    for key in module.metric_keys:
        value = result.metrics[f"val/{key}"]
        assert value == value, (key, value)  # not NaN


def _output_tensors(output: Any) -> dict[str, torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return {"output": output}
    return {k: v for k, v in output.items() if isinstance(v, torch.Tensor) and k != "loss"}


def check_export(name: str, tmp_path: Path) -> None:
    """``export`` writes what the model's own library loads without kiln (transformers by
    the saved architecture, timm by ``local-dir:``), with equal outputs; ``load_export``
    loads it back into a differently initialized model, whose outputs differed before."""
    torch.manual_seed(0)
    module = tiny_model(name).eval()
    out = module.export(tmp_path / "export")
    config = json.loads((out / "config.json").read_text())
    inputs = module.model_inputs(module.example_batch(2))
    if "architectures" in config:  # transformers
        import transformers

        plain = getattr(transformers, config["architectures"][0]).from_pretrained(out).eval()
        if getattr(module, "tokenizer", None) is not None:
            tokenizer = transformers.AutoTokenizer.from_pretrained(out)
            assert len(tokenizer) == len(module.tokenizer)

        def run(model: Any) -> dict[str, torch.Tensor]:
            return _output_tensors(model(**inputs))
    else:  # timm: the network takes the images as its one positional argument
        import timm

        plain = timm.create_model(f"local-dir:{out}", pretrained=True).eval()

        def run(model: Any) -> dict[str, torch.Tensor]:
            return _output_tensors(model(*inputs.values()))

    with torch.no_grad():
        expected, actual = run(module.model), run(plain)
    assert expected and set(actual) == set(expected)
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key])
    torch.manual_seed(1)
    other = tiny_model(name).eval()
    with torch.no_grad():
        fresh = run(other.model)
    assert any(not torch.allclose(fresh[k], expected[k]) for k in expected), "same weights"
    other.load_export(out)
    with torch.no_grad():
        loaded = run(other.model)
    for key in expected:
        torch.testing.assert_close(loaded[key], expected[key])


CHECKS = (
    check_forward_backward_and_validation,
    check_bf16_mixed,
    check_checkpoint_round_trip,
    check_no_graph_breaks,
    check_fit_step,
    check_export,
)
"""The whole kit (the inductor check compiles C++: the suite runs it on one model only)."""


def run_kit(name: str, tmp_path: Path) -> None:
    """Every check of the kit on model ``name`` (a plugin's test calls this)."""
    for check in CHECKS:
        if "tmp_path" in check.__code__.co_varnames[: check.__code__.co_argcount]:
            check(name, tmp_path / check.__name__)
        else:
            check(name)
