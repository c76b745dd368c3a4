"""Suite-wide settings: offline and quiet. No thread counts: kiln decides each rank's
(``trainer.threads_per_rank``), and the tests run in the environment users get."""

import os

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config, items):
    """Skip ``gpu`` tests without a CUDA device and ``slurm`` tests without SLURM
    (``make test`` deselects what the machine cannot run; ``make test-slurm`` starts a cluster)."""
    import shutil

    import pytest
    import torch

    missing = {
        "gpu": None
        if torch.cuda.is_available()
        else "needs a CUDA GPU (run scripts/gpu_check.sh on one)",
        "slurm": None
        if shutil.which("sbatch")
        else "no sbatch on PATH: start a cluster with make test-slurm",
    }
    for item in items:
        for marker, reason in missing.items():
            if reason and item.get_closest_marker(marker):
                item.add_marker(pytest.mark.skip(reason=reason))
