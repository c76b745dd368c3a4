"""Every registered model, at its tiny size, through the test kit (``kiln.models.testing``): the
contract, bf16, a checkpoint round trip, graph breaks, inductor, a fit step, the export."""

import pytest

import kiln.models as km
from kiln.models import testing as kit

MODELS = km.list_models()
# Inductor compiles C++ on the CPU: the default suite compiles only the tiniest model.
INDUCTOR_FAST = {"bert-tiny-cls"}
# Dynamo tracing and checkpoint round trips (two fits) cost seconds per model: make test runs
# one model per kind of wrapper (HF encoder, decoder, encoder-decoder; timm CNN, ViT) and
# make test-all the other tiny models (`long`); the aliases that build the same tiny config
# (bert-cls, hf-lm, timm, ...) run under -m slow.
FAMILY_FAST = {"bert-tiny-cls", "llama-tiny-lm", "t5-tiny-seq2seq", "resnet-tiny", "vit-tiny"}
TRACE_ALL = FAMILY_FAST | {"minilm-cls", "gpt2-tiny-lm", "bart-tiny-seq2seq"}
TRACE_ALL |= {"bert-tiny-mlm", "bert-tiny-qa", "bert-tiny-token-cls"}
# bf16, a fit step and the export: the same, then every model in make test-all; every
# model's forward, backward and validation in both.


def _params(fast: set[str], mark=pytest.mark.slow) -> list:
    """``fast`` in make test, the other tiny models `long`, the aliases ``mark``."""
    return [
        pytest.param(n, marks=() if n in fast else pytest.mark.long if n in TRACE_ALL else mark)
        for n in MODELS
    ]


@pytest.mark.parametrize("name", MODELS)
def test_forward_backward_and_validation(name):
    kit.check_forward_backward_and_validation(name)


@pytest.mark.parametrize("name", _params(FAMILY_FAST, pytest.mark.long))
def test_bf16_mixed_forward_backward(name):
    kit.check_bf16_mixed(name)


@pytest.mark.parametrize("name", _params(FAMILY_FAST))
def test_checkpoint_round_trip(name, tmp_path):
    kit.check_checkpoint_round_trip(name, tmp_path)


@pytest.mark.parametrize("name", _params(FAMILY_FAST))
def test_compiles_without_graph_breaks(name):
    kit.check_no_graph_breaks(name)


@pytest.mark.parametrize("name", _params(INDUCTOR_FAST))
def test_inductor_fullgraph_matches_eager(name):
    kit.check_inductor_matches_eager(name)


@pytest.mark.parametrize("name", _params(FAMILY_FAST, pytest.mark.long))
def test_one_optimizer_step_through_kiln_core(name):
    kit.check_fit_step(name)


@pytest.mark.parametrize("name", _params(FAMILY_FAST, pytest.mark.long))
def test_export_loads_with_its_own_library(name, tmp_path):
    kit.check_export(name, tmp_path)
