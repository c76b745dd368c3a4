"""Worker functions for test_launch: spawned processes import them by reference.

Kept apart from the test module, and free of kiln imports, so a worker process only pays
for what it uses (importing lightning takes seconds on a small machine).
"""

import os


def ddp_all_reduce(tag: str) -> dict:
    import torch
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    total = fabric.all_reduce(torch.tensor([fabric.global_rank + 1.0]), reduce_op="sum")
    return {
        "rank": fabric.global_rank,
        "world_size": fabric.world_size,
        "sum": total.item(),
        "tag": tag,
        "threads": os.environ.get("OMP_NUM_THREADS"),
    }


def fail_on_rank_one(tag: str) -> int:
    if os.environ["RANK"] == "1":
        raise ValueError(f"worker says no ({tag})")
    return 0
