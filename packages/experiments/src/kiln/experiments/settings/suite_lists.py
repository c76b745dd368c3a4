"""PyTorch's own benchmark lists (``benchmarks/dynamo``), shipped as data: names, batch sizes.

``pt2_lists/huggingface_models_list.txt`` and ``pt2_lists/timm_models_list.txt`` are verbatim
copies of the files PyTorch's dashboard runs (one ``name,batch_size`` or ``name batch_size``
a line) under a ``# source:`` header naming the commit they were read at. This module only
reads them (no torch, no transformers): the sweep presets list their names through the
``${kiln_pt2_models:hf}`` resolver at compose time; :mod:`kiln.experiments.bench.suites`
builds the models.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

SUITE_MODEL = "pt2"
"""``model.name`` of a suite model (``configs/model/bench/pt2.yaml``)."""


def is_suite_model(model_cfg: dict) -> bool:
    """Whether a resolved ``model`` config is a suite model (``model=bench/pt2``)."""
    return model_cfg.get("name") == SUITE_MODEL


@dataclass(frozen=True)
class SuiteList:
    """One of PyTorch's benchmark lists."""

    suite: str
    """kiln's name of the suite (``hf`` or ``timm``): ``model.suite`` in configs."""
    filename: str
    """The list's file name, in PyTorch's repository and in ``pt2_lists/``."""
    divisors: dict[str, int] = field(default_factory=dict)
    """PyTorch's training batch-size divisors (``batch_size.divisors`` of
    ``huggingface.yaml`` / ``timm_models.yaml``): a training run uses the list's batch size
    divided by these, at least 1."""


SUITES = {
    "hf": SuiteList(
        "hf",
        "huggingface_models_list.txt",
        # benchmarks/dynamo/huggingface.yaml at commit 33c040b56dbc9bbd387559563b838b8600e53aa4
        {
            "AlbertForMaskedLM": 2,
            "AllenaiLongformerBase": 2,
            "BartForCausalLM": 2,
            "BertForMaskedLM": 2,
            "BlenderbotForCausalLM": 8,
            "DebertaV2ForMaskedLM": 4,
            "DistilBertForMaskedLM": 2,
            "DistillGPT2": 2,
            "ElectraForCausalLM": 2,
            "GPT2ForSequenceClassification": 2,
            "GoogleFnet": 2,
            "LayoutLMForMaskedLM": 2,
            "M2M100ForConditionalGeneration": 4,
            "MBartForCausalLM": 2,
            "MT5ForConditionalGeneration": 2,
            "MegatronBertForCausalLM": 4,
            "MobileBertForMaskedLM": 2,
            "OPTForCausalLM": 2,
            "PLBartForCausalLM": 2,
            "PegasusForCausalLM": 4,
            "RobertaForCausalLM": 2,
            "T5ForConditionalGeneration": 2,
            "T5Small": 2,
            "TrOCRForCausalLM": 2,
            "XGLMForCausalLM": 4,
            "XLNetLMHeadModel": 2,
            "YituTechConvBert": 2,
        },
    ),
    "timm": SuiteList(
        "timm",
        "timm_models_list.txt",
        # benchmarks/dynamo/timm_models.yaml at commit 1869dff181f490e9e23efcc728dcd07a8a4d5808
        {
            "beit_base_patch16_224": 2,
            "deit_base_distilled_patch16_224": 2,
            "gluon_xception65": 2,
            "mobilevit_s": 2,
            "swin_base_patch4_window7_224": 2,
        },
    ),
}
"""The suites kiln-bench runs (``sweep=pt2_hf``, ``sweep=pt2_timm``)."""


def suite_list(suite: str) -> SuiteList:
    """The :class:`SuiteList` named ``suite``; an unknown name lists the valid ones."""
    if suite not in SUITES:
        raise ValueError(f"model.suite={suite!r} is not valid; choose one of: {', '.join(SUITES)}")
    return SUITES[suite]


def _text(suite: str) -> str:
    return (
        resources.files("kiln.experiments.bench")
        .joinpath("pt2_lists", suite_list(suite).filename)
        .read_text()
    )


@cache
def list_batch_sizes(suite: str) -> dict[str, int]:
    """``{name: batch size}`` of the suite's list, in the list's order.

    Raises:
        ValueError: A line that is not ``name,batch`` or ``name batch`` (naming it).
    """
    sizes: dict[str, int] = {}
    for number, line in enumerate(_text(suite).splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p for p in re.split(r"[,\s]+", line) if p]
        if len(parts) != 2 or not parts[1].isdigit():
            raise ValueError(
                f"{suite_list(suite).filename} line {number}: {line!r} is not 'name,batch_size'"
            )
        sizes[parts[0]] = int(parts[1])
    return sizes


def source_revision(suite: str) -> str:
    """The ``# source:`` header of the suite's list: where and at which commit it was read."""
    for line in _text(suite).splitlines():
        if line.startswith("# source:"):
            return line.removeprefix("# source:").strip()
    return "unknown"


def suite_batch_size(suite: str, name: str) -> int:
    """The batch size PyTorch's harness trains ``name`` with: the list's, over its divisor.

    Raises:
        ValueError: ``name`` is not in the suite's list (naming the list and a few of its names).
    """
    sizes = list_batch_sizes(suite)
    if name not in sizes:
        raise ValueError(
            f"{name!r} is not in the {suite} suite ({source_revision(suite)}); "
            f"its models: {', '.join(sizes)}"
        )
    return max(sizes[name] // suite_list(suite).divisors.get(name, 1), 1)


def sweep_values(suite: str) -> str:
    """The suite's names as one Hydra sweep value, each quoted (``'a','b/c',...``): the
    ``${kiln_pt2_models:<suite>}`` resolver of ``configs/sweep/pt2_*.yaml``."""
    return ",".join(f"'{name}'" for name in list_batch_sizes(suite))
