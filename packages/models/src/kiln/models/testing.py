"""kiln's model test kit: the checks every registered model passes, one function each.

A plugin's test runs all of them on its model::

    from kiln.models.testing import run_kit

    def test_my_model(tmp_path):
        run_kit("my-model", tmp_path)

kiln's own suite runs them over ``list_models()`` (kiln's models and every installed
plugin's). Each model supplies what a check needs: its tiny variant (``tiny`` in the
registry), its metric keys (``metric_keys``), its export (``export``/``load_export``) and
the data the two training checks use: the class's ``tiny_data()``, which a plugin model
inherits from its base class (digits for an ``ImageClassifier``, generated text for the HF
wrappers) unless it overrides it; ``run_kit(..., data=make_data)`` trains on the plugin's
own data module instead.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import kiln.models as km
from kiln.core import TrainerConfig, fit
from kiln.core.loop.precision_audit import precision_audit
from kiln.models.module import KilnModule

DataFactory = Callable[[], Any]
"""Builds a fresh data module for a check that trains (each build is attached to one model)."""


class KitCheckFailed(AssertionError):
    """A check of the kit failed: the message names the check, the model and what differs."""


def _named(check: Callable[..., None]) -> Callable[..., None]:
    """``check`` whose every failure is a :class:`KitCheckFailed` that starts with
    ``<check>(<model>)``: a plugin author's test output says which check failed on which
    model, not only torch's words."""
    import functools

    @functools.wraps(check)
    def named(name: str, *args: Any, **kwargs: Any) -> None:
        try:
            check(name, *args, **kwargs)
        except KitCheckFailed as failed:
            raise KitCheckFailed(f"{check.__name__}({name!r}): {failed}") from failed.__cause__
        except Exception as error:
            what = str(error) or "failed"
            if not isinstance(error, AssertionError):
                what = f"{type(error).__name__}: {what}"
            raise KitCheckFailed(f"{check.__name__}({name!r}): {what}") from error

    return named


def _shapes(tensors: dict[str, Any]) -> str:
    """``"name (4, 32) int64, ..."`` of the tensors in ``tensors``."""
    return ", ".join(
        f"{k} {tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}"
        for k, v in tensors.items()
        if isinstance(v, torch.Tensor)
    )


def _forward_shapes(module: Any, batch: dict[str, Any]) -> str:
    """What the model's forward returns for ``batch`` next to what the batch holds (the
    logits' shape against the labels'), or why it cannot be run."""
    try:
        with torch.no_grad():
            out = module(**module.model_inputs(batch))
        returned = _shapes(_output_tensors(out))
    except Exception as error:
        returned = f"the forward itself raised {type(error).__name__}: {error}"
    return f"the forward returns {returned}; the batch holds {_shapes(batch)}"


def _step(module: Any, method: str, batch: dict[str, Any]) -> Any:
    """``module.<method>(batch, 0)``; a failure names the method and the shapes involved."""
    try:
        return getattr(module, method)(batch, 0)
    except Exception as error:
        raise KitCheckFailed(
            f"{method}(example_batch) raised {type(error).__name__}: {error} "
            f"({_forward_shapes(module, batch)})"
        ) from error


def _assert_same(actual: dict[str, Any], expected: dict[str, Any], what: str, **tol: Any) -> None:
    """Each tensor of ``actual`` equals (within ``tol``) ``expected``'s of the same name;
    a failure names the tensor, ``what`` was compared, and how they differ."""
    missing = sorted(set(expected) - set(actual))
    if missing:
        raise KitCheckFailed(f"{what}: {', '.join(missing)} missing")
    for key in expected:
        torch.testing.assert_close(
            actual[key], expected[key], msg=lambda m, key=key: f"{what}, {key!r}: {m}", **tol
        )


def _differing_weights(actual: dict[str, Any], expected: dict[str, Any]) -> str:
    """Which weights of ``expected`` (a state dict) ``actual`` lacks or holds other values of."""
    missing = sorted(set(expected) - set(actual))
    different = sorted(
        k
        for k in set(expected) & set(actual)
        if isinstance(expected[k], torch.Tensor)
        and (actual[k].shape != expected[k].shape or not torch.equal(actual[k], expected[k]))
    )
    parts = [f"missing: {', '.join(missing[:8])}"] if missing else []
    parts += [f"different: {', '.join(different[:8])}"] if different else []
    return "; ".join(parts) or "every weight is equal"


def model_class(name: str) -> type:
    """The class ``create_model(name)`` builds (its tiny variant, built once to see)."""
    return type(km.create_model(name, tiny=True))


def tiny_model(name: str, data: Any = None, **kwargs: Any) -> Any:
    """The registered model ``name`` at its test size; ``data=True`` adds its class's
    ``tiny_data()``, a callable adds what it returns, anything else is the data module."""
    entry = km.get_model_entry(name)
    if data is True:
        kwargs["data"] = model_class(name).tiny_data()
    elif callable(data):
        kwargs["data"] = data()
    elif data is not None:
        kwargs["data"] = data
    return km.create_model(name, **{**entry.tiny, **kwargs})


def _trainer(**kwargs: Any) -> TrainerConfig:
    base = dict(max_steps=1, accelerator="cpu", limit_val_batches=1, progress=False)
    return TrainerConfig(**{**base, **kwargs})


@_named
def check_forward_backward_and_validation(name: str) -> None:
    """A finite loss with its item count, finite non-zero gradients, per-sample validation
    outputs and exactly the model's ``metric_keys`` as floats."""
    module = tiny_model(name)
    batch = module.example_batch(4)
    out = _step(module, "training_step", batch)
    loss = out["loss"]
    assert loss.ndim == 0 and torch.isfinite(loss), (
        f"training_step's loss is {loss.tolist()} (shape {tuple(loss.shape)}): expected one "
        "finite number"
    )
    counted = int(module.count_items(batch))
    assert int(out["num_items"]) == counted > 0, (
        f"training_step's num_items is {int(out['num_items'])}, count_items(batch) is "
        f"{counted}: they must agree, and be > 0"
    )
    loss.backward()
    params = [(k, p.grad) for k, p in module.named_parameters() if p.requires_grad]
    bad = [k for k, g in params if g is None or not torch.isfinite(g).all()]
    assert not bad, f"no gradient, or a non-finite one, for: {', '.join(bad[:8])}"
    assert sum(float(g.abs().sum()) for _, g in params) > 0, "every gradient is zero"
    module.eval()
    with torch.no_grad():
        outputs = _step(module, "validation_step", batch)
    not_per_sample = {k: v for k, v in outputs.items() if v.shape[:1] != (4,)}
    assert not not_per_sample, (
        f"validation_step's outputs must be per sample, batch first (4 here): "
        f"{_shapes(not_per_sample)}"
    )
    metrics = module.validation_metrics(outputs)
    assert set(metrics) == set(module.metric_keys), (
        f"validation_metrics returned {sorted(metrics)}, metric_keys are "
        f"{sorted(module.metric_keys)}"
    )
    not_float = {k: type(v).__name__ for k, v in metrics.items() if not isinstance(v, float)}
    assert not not_float, f"metrics must be floats: {not_float}"


DENSE_OPS = {"aten.mm", "aten.addmm", "aten.convolution", "aten.convolution_backward"}
"""The matmuls of the weight-holding layers (linear, convolution): the bulk of the FLOPs."""


@_named
def check_bf16_mixed(name: str) -> None:
    """Under bf16-mixed, run as kiln.core runs it (Fabric's autocast), every linear and
    convolution matmul of the forward and of the backward runs in bf16: the precision audit
    sees the dtypes the ops really ran in (below autocast), not the float32 loss and
    gradients autocast returns. Attention's batched matmuls may run in float32: torch's
    SDPA math kernel (the CPU's, with a mask) computes bf16 inputs in float32."""
    module = tiny_model(name)
    audit = precision_audit(module, module.example_batch(2), precision="bf16-mixed")
    dense = [op for op in audit.ops if op.op in DENSE_OPS]
    assert any(op.backward for op in dense) and any(not op.backward for op in dense), (
        f"the audit saw no linear or convolution matmul in the forward or the backward: {audit}"
    )
    not_bf16 = [op for op in dense if op.dtype != "bfloat16"]
    assert not not_bf16, f"matmuls not in bfloat16 under bf16-mixed: {not_bf16}\n{audit}"
    assert audit.dtypes(matmuls_only=True).get("bfloat16", 0) > 0, f"no bf16 matmul: {audit}"


@_named
def check_checkpoint_round_trip(name: str, tmp_path: Path, data: DataFactory | None = None) -> None:
    """Trained one step by ``kiln.core.fit`` and resumed from its checkpoint into a
    differently initialized model, it validates exactly as the trained one (on ``data()``,
    or the class's ``tiny_data()``)."""
    torch.manual_seed(0)
    trained = tiny_model(name, data=data or True)
    saved = fit(trained, trainer=_trainer(checkpoint_dir=str(tmp_path)))
    assert saved.checkpoint is not None and saved.global_step == 1, (
        f"one step of fit wrote checkpoint {saved.checkpoint} at step {saved.global_step}"
    )
    torch.manual_seed(1)  # a different random init, overwritten by the load
    loaded = tiny_model(name, data=data or True)
    before = {k: v.detach().clone() for k, v in loaded.state_dict().items()}
    assert any(not torch.equal(v, before[k]) for k, v in trained.state_dict().items()), (
        "two random inits (seeds 0 and 1) built equal weights: the check would prove nothing"
    )
    resumed = fit(loaded, trainer=_trainer(resume=saved.checkpoint))
    assert resumed.global_step == 1, f"resumed at step {resumed.global_step}, saved at 1"
    trained.eval()
    loaded.eval()
    weights = _differing_weights(loaded.state_dict(), trained.state_dict())
    batch = trained.example_batch(2)
    with torch.no_grad():
        expected, actual = trained.validation_step(batch, 0), loaded.validation_step(batch, 0)
    _assert_same(actual, expected, f"validation_step after the resume ({weights})")


@_named
def check_no_graph_breaks(name: str) -> None:
    """The training step compiles as one graph."""
    module = tiny_model(name)
    batch = module.example_batch(2)
    explanation = torch._dynamo.explain(lambda b: module.training_step(b, 0)["loss"])(batch)
    reasons = [str(r.reason) for r in explanation.break_reasons]
    assert explanation.graph_break_count == 0, f"graph breaks: {reasons}"


@_named
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
    _assert_same(
        actual, expected, "inductor's validation_step against eager's", rtol=1e-4, atol=1e-4
    )


@_named
def check_fit_step(name: str, data: DataFactory | None = None) -> None:
    """One optimizer step through ``kiln.core.fit`` on ``data()`` (or the class's
    ``tiny_data()``) changes the weights and validates to every one of its ``metric_keys``."""
    module = tiny_model(name, data=data or True)
    before = {k: v.detach().clone() for k, v in module.named_parameters()}
    result = fit(module, trainer=_trainer())
    assert result.global_step == 1, f"fit ended at step {result.global_step}, not 1"
    changed = [k for k, v in module.named_parameters() if not torch.equal(v, before[k])]
    assert changed, "the optimizer step changed no parameter"
    missing = [k for k in module.metric_keys if f"val/{k}" not in result.metrics]
    assert not missing, f"validation reported no {missing} (it reported {sorted(result.metrics)})"
    nan = [
        k for k in module.metric_keys if result.metrics[f"val/{k}"] != result.metrics[f"val/{k}"]
    ]
    assert not nan, f"validation's {nan} are NaN after one step"


def _output_tensors(output: Any) -> dict[str, torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return {"output": output}
    return {k: v for k, v in output.items() if isinstance(v, torch.Tensor) and k != "loss"}


def _tensors(outputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in outputs.items() if isinstance(v, torch.Tensor)}


def uses_library_export(module: Any) -> bool:
    """Whether ``module`` keeps ``KilnModule``'s transformers/timm export (not its own)."""
    cls = type(module)
    return cls.export is KilnModule.export and cls.load_export is KilnModule.load_export


@_named
def check_export(name: str, tmp_path: Path) -> None:
    """``load_export`` of an ``export`` loads it into a differently initialized model, whose
    validation outputs differed before and equal the exported model's after. A model with
    the default export is also loaded by its own library without kiln (transformers by the
    saved architecture, timm by ``local-dir:``), with equal outputs; a model that overrides
    ``export`` and ``load_export`` is checked through them alone."""
    torch.manual_seed(0)
    module = tiny_model(name).eval()
    out = Path(module.export(tmp_path / "export"))
    batch = module.example_batch(2)
    if uses_library_export(module):
        _check_library_load(module, out, batch)
    torch.manual_seed(1)
    other = tiny_model(name).eval()
    with torch.no_grad():
        expected = _tensors(module.validation_step(batch, 0))
        fresh = _tensors(other.validation_step(batch, 0))
    assert expected, "validation_step returned no tensors to compare"
    assert any(not torch.equal(fresh[k], expected[k]) for k in expected), (
        "two random inits (seeds 0 and 1) validate alike: the check would prove nothing"
    )
    other.load_export(out)
    weights = _differing_weights(other.state_dict(), module.state_dict())
    with torch.no_grad():
        loaded = _tensors(other.validation_step(batch, 0))
    _assert_same(loaded, expected, f"validation_step after load_export({out}) ({weights})")


def _check_library_load(module: Any, out: Path, batch: dict[str, torch.Tensor]) -> None:
    config = json.loads((out / "config.json").read_text())
    inputs = module.model_inputs(batch)
    if "architectures" in config:  # transformers
        import transformers

        plain = getattr(transformers, config["architectures"][0]).from_pretrained(out).eval()
        if getattr(module, "tokenizer", None) is not None:
            tokenizer = transformers.AutoTokenizer.from_pretrained(out)
            assert len(tokenizer) == len(module.tokenizer), (
                f"the exported tokenizer has {len(tokenizer)} tokens, the model's "
                f"{len(module.tokenizer)}"
            )

        def run(model: Any) -> dict[str, torch.Tensor]:
            return _output_tensors(model(**inputs))
    else:  # timm: the network takes the images as its one positional argument
        import timm

        plain = timm.create_model(f"local-dir:{out}", pretrained=True).eval()

        def run(model: Any) -> dict[str, torch.Tensor]:
            return _output_tensors(model(*inputs.values()))

    with torch.no_grad():
        expected, actual = run(module.model), run(plain)
    library = "transformers" if "architectures" in config else "timm"
    assert expected, "the model's forward returned no tensor to compare"
    weights = _differing_weights(plain.state_dict(), module.model.state_dict())
    _assert_same(actual, expected, f"{out} loaded by {library} alone ({weights})")


CHECKS = (
    check_forward_backward_and_validation,
    check_bf16_mixed,
    check_checkpoint_round_trip,
    check_no_graph_breaks,
    check_fit_step,
    check_export,
)
"""The whole kit (the inductor check compiles C++: the suite runs it on one model only)."""


def run_kit(name: str, tmp_path: str | Path, data: DataFactory | None = None) -> None:
    """Every check of the kit on model ``name`` (a plugin's test calls this).

    Args:
        name: A registered model (``list_models()``).
        tmp_path: A directory for the checkpoints and exports the checks write.
        data: Builds a fresh data module of the plugin's own data for the two checks that
            train; ``None`` uses the model class's ``tiny_data()`` (inherited from its base
            class unless the plugin overrides it).
    """
    for check in CHECKS:
        params = inspect.signature(check).parameters  # the check's own (through _named)
        kwargs: dict[str, Any] = {"data": data} if "data" in params else {}
        if "tmp_path" in params:
            kwargs["tmp_path"] = Path(tmp_path) / check.__name__
        check(name, **kwargs)
