"""Every registered model, at its tiny size: the contract, compile, precision, export."""

import pytest
import torch
from conftest import tiny_model

import kiln.models as km
from kiln.core import TrainerConfig, fit

MODELS = km.list_models()
HF_MODELS = [n for n in MODELS if km.get_model_entry(n).task != "image-classification"]
# Inductor compiles C++ on the CPU: the default suite compiles only the tiniest model.
INDUCTOR_FAST = {"bert-tiny-cls"}
# Dynamo tracing costs seconds per model: the default suite traces one model per family;
# the aliases that build the same tiny config (bert-cls, hf-lm, timm, ...) run under -m slow.
# Checkpoint round trips through kiln.core (two fits each) pick the same subset.
TRACE_FAST = {"bert-tiny-cls", "minilm-cls", "gpt2-tiny-lm", "llama-tiny-lm"}
TRACE_FAST |= {"resnet-tiny", "vit-tiny"}


def _metrics_keys(task: str) -> set[str]:
    return {"perplexity", "loss"} if task == "causal-lm" else {"accuracy", "f1", "loss"}


@pytest.mark.parametrize("name", MODELS)
def test_forward_backward_and_validation(name):
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
    assert set(metrics) == _metrics_keys(module.task)
    assert all(isinstance(v, float) for v in metrics.values())


@pytest.mark.parametrize("name", MODELS)
def test_bf16_mixed_forward_backward(name):
    module = tiny_model(name)
    batch = module.example_batch(2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = module.training_step(batch, 0)["loss"]
    assert loss.dtype == torch.float32 and torch.isfinite(loss)  # losses are upcast
    loss.backward()
    assert all(p.grad.dtype == torch.float32 for p in module.parameters() if p.grad is not None)


def _params(fast: set[str]) -> list:
    return [pytest.param(n, marks=() if n in fast else pytest.mark.slow) for n in MODELS]


@pytest.mark.parametrize("name", _params(TRACE_FAST))
def test_checkpoint_round_trip(name, tmp_path):
    """A model trained one step by ``kiln.core.fit`` and resumed from its checkpoint into a
    differently initialized model validates exactly as the trained one."""
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


@pytest.mark.parametrize("name", _params(TRACE_FAST))
def test_compiles_without_graph_breaks(name):
    """Graph breaks are counted and reported; every kiln model compiles as one graph."""
    module = tiny_model(name)
    batch = module.example_batch(2)
    explanation = torch._dynamo.explain(lambda b: module.training_step(b, 0)["loss"])(batch)
    reasons = [str(r.reason) for r in explanation.break_reasons]
    assert explanation.graph_break_count == 0, f"{name} graph breaks: {reasons}"


def _inductor_params():
    return [pytest.param(n, marks=() if n in INDUCTOR_FAST else pytest.mark.slow) for n in MODELS]


@pytest.mark.parametrize("name", _inductor_params())
def test_inductor_fullgraph_matches_eager(name):
    torch._dynamo.reset()
    module = tiny_model(name).eval()  # eval: no dropout, so eager and compiled agree
    batch = module.example_batch(2)
    compiled = torch.compile(
        lambda b: module.validation_step(b, 0), backend="inductor", fullgraph=True
    )
    with torch.no_grad():
        expected, actual = module.validation_step(batch, 0), compiled(batch)
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", HF_MODELS)
def test_hf_export_loads_with_plain_transformers(name, tmp_path):
    import transformers

    module = tiny_model(name).eval()
    module.save_pretrained(tmp_path)
    auto = getattr(transformers, type(module).auto_class_name)
    plain = auto.from_pretrained(tmp_path).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert len(tokenizer) == len(module.tokenizer)
    ids = module.example_batch(2)["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, module.model(input_ids=ids).logits)
