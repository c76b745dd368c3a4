"""The HF wrapper's pretrained weights: fp32 masters in memory of their own."""

from pathlib import Path

import pytest
import torch


def _mapped_ranges(file_name: str) -> list[tuple[int, int]]:
    """The address ranges of this process's mappings of files named ``file_name``."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[5].endswith("/" + file_name):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads Linux's /proc")
def test_pretrained_weights_are_fp32_masters_outside_the_checkpoints_file_mapping():
    """``from_pretrained`` leaves a safetensors checkpoint's weights in its copy-on-write
    file mapping, which the first optimizer step would fault in page by page; the wrapper's
    parameters live in memory of their own, in fp32, with the checkpoint's values."""
    import safetensors.torch
    from transformers import AutoModelForSequenceClassification

    from kiln.models.hf import HFSequenceClassifier, minilm_path

    module = HFSequenceClassifier(pretrained="minilm", num_labels=2)
    plain = AutoModelForSequenceClassification.from_pretrained(minilm_path(), num_labels=2)
    ranges = _mapped_ranges("model.safetensors")

    def mapped(param: torch.Tensor) -> bool:
        return any(start <= param.data_ptr() < end for start, end in ranges)

    # the reference: plain from_pretrained still leaves its weights in the mapping
    assert any(mapped(p) for p in plain.parameters()), "the copy is no longer needed"
    weights = dict(module.model.named_parameters())
    for name, param in weights.items():
        assert param.dtype == torch.float32, name
        assert not mapped(param), name
    saved = safetensors.torch.load_file(Path(minilm_path()) / "model.safetensors")
    prefix = module.model.base_model_prefix + "."  # the checkpoint holds the bare encoder
    compared = {prefix + key: value for key, value in saved.items() if prefix + key in weights}
    assert set(compared) == {n for n in weights if not n.startswith("classifier.")}  # new head
    for name, value in compared.items():
        assert torch.equal(weights[name], value), name
