"""Metrics as ``evaluate`` modules shipped inside kiln.models, so they load offline.

``evaluate.load("accuracy")`` fetches a script from the hub; kiln ships its own metric
scripts (accuracy, f1, perplexity, SQuAD's exact match and F1, seqeval's entity F1, and
exact match, sacreBLEU and chrF of generated text) and loads them by local path instead.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import evaluate

METRICS_DIR = Path(__file__).parent
METRIC_NAMES = ("accuracy", "f1", "generated_text", "perplexity", "seqeval", "squad")


def metric_info(description: str, inputs: str, **features: str | list[str]) -> evaluate.MetricInfo:
    """The ``_info`` of a kiln metric script: its description, its inputs' docs, and one
    feature per input: a ``datasets.Value`` of a dtype (``predictions="int64"``), or a
    ``datasets.Sequence`` of one for a one-element list (``predictions=["string"]``)."""
    import datasets

    def feature(dtype: str | list[str]) -> Any:  # datasets 4+ makes a Sequence a List
        if isinstance(dtype, list):
            (inner,) = dtype  # one dtype, of the sequence's items
            return datasets.Sequence(datasets.Value(inner))
        return datasets.Value(dtype)

    return evaluate.MetricInfo(
        description=description,
        citation="",
        inputs_description=inputs,
        features=datasets.Features({k: feature(v) for k, v in features.items()}),
    )


@functools.cache
def load_metric(name: str) -> evaluate.EvaluationModule:
    """Load one of kiln's packaged metrics by name, from its local directory.

    Args:
        name: One of ``METRIC_NAMES``.

    Returns:
        The ``evaluate`` module (cached per process).
    """
    if name not in METRIC_NAMES:
        raise ValueError(f"unknown metric {name!r}; kiln ships: {', '.join(METRIC_NAMES)}")
    return evaluate.load(str(METRICS_DIR / name))


__all__ = ["METRIC_NAMES", "load_metric", "metric_info"]
