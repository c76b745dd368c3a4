"""Shared fixtures: offline HF settings, a per-session cache, tiny data for the data tests."""

from __future__ import annotations

import os

# Nothing may reach the hub: metric modules, models and data must all load offline.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest

from kiln.models.data import ImageClassificationData, TextClassificationData
from kiln.models.hf import TINY_TEXT


@pytest.fixture(scope="session", autouse=True)
def kiln_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("kiln-cache"))
    os.environ["KILN_CACHE"] = path
    return path


def tiny_data(task: str, **kwargs):
    """A small data module for the data tests: digits, or generated sentiment text."""
    if task == "image-classification":
        return ImageClassificationData(**{"batch_size": 16, "val_batch_size": 32, **kwargs})
    assert task == "text-classification", task
    return TextClassificationData(**{**TINY_TEXT, **kwargs})
