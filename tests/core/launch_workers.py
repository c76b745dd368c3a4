"""Worker functions for test_launch: spawned processes import them by reference.

Kept apart from the test module, and free of kiln imports at the top, so a worker process
only pays for what it uses (importing lightning takes seconds on a small machine).
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


def threads_of_a_rank(devices: int, num_nodes: int) -> dict:
    """The intra-op threads this rank computes with once kiln applied its
    ``trainer.threads_per_rank`` (default), and what its launcher had given it."""
    import torch
    from lightning.fabric import Fabric

    from kiln.core.config import TrainerConfig
    from kiln.core.distributed.threads import apply_threads_per_rank

    given = torch.get_num_threads()
    apply_threads_per_rank(TrainerConfig(devices=devices, num_nodes=num_nodes))
    # as in fit: Lightning's launch sets its own count where OMP_NUM_THREADS is unset
    fabric = Fabric(accelerator="cpu", devices=devices, num_nodes=num_nodes, strategy="ddp")
    fabric.launch()
    return {"rank": fabric.global_rank, "given": given, "threads": torch.get_num_threads()}


if __name__ == "__main__":  # torchrun runs this file: python launch_workers.py <devices> <nodes>
    import json
    import sys
    from pathlib import Path

    result = threads_of_a_rank(int(sys.argv[1]), int(sys.argv[2]))
    # a file per rank: torchrun interleaves its ranks' stdout within lines
    Path(f"result-{result['rank']}.json").write_text(json.dumps(result))
