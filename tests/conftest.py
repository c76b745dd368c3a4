"""Suite-wide settings: offline, quiet, and small thread pools on a 2-core machine."""

import os

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "2")


def pytest_collection_modifyitems(config, items):
    """Skip ``gpu`` tests without a CUDA device (``make test`` deselects them anyway)."""
    import pytest
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run scripts/gpu_check.sh on one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
