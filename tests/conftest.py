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
    """Skip ``slurm`` tests where there is no SLURM (``make test-slurm`` starts a local one)."""
    import shutil

    import pytest

    if shutil.which("sbatch"):
        return
    skip = pytest.mark.skip(reason="no sbatch on PATH: start a cluster with make test-slurm")
    for item in items:
        if item.get_closest_marker("slurm"):
            item.add_marker(skip)
