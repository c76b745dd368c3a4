"""Shared fixtures: offline HF settings, a per-session cache, tiny data per task."""

from __future__ import annotations

import os

# Nothing may reach the hub: metric modules, models and data must all load offline.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest

import kiln.models as km
from kiln.models.data import (
    CausalLMData,
    ImageClassificationData,
    TextClassificationData,
)


@pytest.fixture(scope="session", autouse=True)
def kiln_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("kiln-cache"))
    os.environ["KILN_CACHE"] = path
    return path


def tiny_data(task: str, **kwargs):
    """A small data module for ``task`` (generated text, or digits)."""
    if task == "image-classification":
        return ImageClassificationData(**{"batch_size": 16, "val_batch_size": 32, **kwargs})
    text = {"num_train": 64, "num_val": 40, "batch_size": 8, "max_length": 32, **kwargs}
    if task == "causal-lm":
        return CausalLMData(**text)
    return TextClassificationData(**text)


def tiny_model(name: str, data=None, **kwargs):
    """The registered model ``name`` at its test size; ``data=True`` adds tiny data."""
    entry = km.get_model_entry(name)
    if data is True:
        kwargs["data"] = tiny_data(entry.task)
    elif data is not None:
        kwargs["data"] = data
    return km.create_model(name, **{**entry.tiny, **kwargs})
