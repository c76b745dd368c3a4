"""docs/model-tasks.md's transformers ViT plugin, run exactly as written, through the test
kit: a new kind of model in one file of at most 30 lines, from the docs alone."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from kiln.models import testing as kit
from kiln.models.registry import _REGISTRY

DOC = Path(__file__).resolve().parents[2] / "docs" / "model-tasks.md"
MARK = "<!-- the ViT plugin:"
NAME = "hf-vit-digits"


def plugin_block() -> str:
    """The python block right after the ``MARK`` comment line."""
    lines = DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(MARK))
    assert lines[start + 1] == "```python", lines[start + 1]
    end = lines.index("```", start + 2)
    return "\n".join(lines[start + 2 : end]) + "\n"


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The block as a user's plugin module, imported (its model registered), then removed."""
    (tmp_path / "docs_vit_plugin.py").write_text(plugin_block())
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("docs_vit_plugin")
    yield NAME
    _REGISTRY.pop(NAME, None)
    sys.modules.pop("docs_vit_plugin", None)


def test_the_documented_plugin_is_one_file_of_at_most_30_lines():
    assert len(plugin_block().strip().splitlines()) <= 30


def test_the_documented_vit_plugin_passes_the_whole_test_kit(plugin, tmp_path):
    module = kit.tiny_model(plugin)
    assert type(module.model).__name__ == "ViTForImageClassification"
    kit.run_kit(plugin, tmp_path)
