"""How many intra-op threads each rank computes with: a decision kiln takes, the same way
whatever started the process.

A float reduction (a matmul, a sum, a norm) on the CPU splits its work over torch's intra-op
threads and adds the parts in an order that depends on how many there are: the same
per-rank work on 1 and on 2 threads ends in other last bits. Each launcher has its own
default: kiln's local launcher gives a worker ``cores // local ranks`` through
``OMP_NUM_THREADS``, torchrun one thread when it starts several, and where the variable is
unset (a SLURM task, a lone torchrun rank) Lightning's ``fabric.launch()`` sets ``cores //
local ranks``, which is all the cores for one rank per node. Without a decision of its own a
float64 job would not be bit-identical across launchers.

The default (``trainer.threads_per_rank`` ``None`` or ``"auto"``) is the cores this process may
use on its node (:func:`usable_cores`: CPU affinity, a cgroup CPU quota, and SLURM's CPUs for
the job on the node) divided by the job's ranks: ``devices x num_nodes``, not the ranks on
this node. Only the global job shape is known alike to every launcher and every layout:
dividing by the ranks per node would give each rank of a 2-node x 1-device job twice the
threads of a 1-node x 2-device one, whose per-rank work is the same. The price is that a
multi-node job uses ``1 / num_nodes`` of a node's cores for intra-op work unless
``threads_per_rank`` says otherwise (torchrun gives each of several ranks one thread).
"""

from __future__ import annotations

import os
from typing import Any

from kiln.core.telemetry.machine import usable_cores

AUTO = "auto"


def default_threads_per_rank(devices: int, num_nodes: int, cores: int | None = None) -> int:
    """The threads each rank of a job of ``devices x num_nodes`` ranks computes with by default.

    Args:
        devices: The job's ranks on each node (``trainer.devices``).
        num_nodes: Its nodes (``trainer.num_nodes``).
        cores: The cores this process may use; ``None``: :func:`usable_cores` for ``devices``
            ranks on this node.

    Returns:
        ``max(1, cores // (devices x num_nodes))``.
    """
    cores = usable_cores(devices) if cores is None else cores
    return max(1, cores // (devices * num_nodes))


def threads_per_rank(trainer: Any) -> int:
    """The intra-op threads a rank of ``trainer``'s job computes with: its
    ``threads_per_rank`` when it is an integer, else :func:`default_threads_per_rank`.

    Args:
        trainer: A ``kiln.core.TrainerConfig`` (validated: ``threads_per_rank`` is ``None``,
            ``"auto"`` or an integer >= 1).
    """
    chosen = trainer.threads_per_rank
    if isinstance(chosen, int):
        return chosen
    return default_threads_per_rank(trainer.devices, trainer.num_nodes)


def apply_threads_per_rank(trainer: Any) -> int:
    """Set torch's intra-op threads (OpenMP's and MKL's) to :func:`threads_per_rank` in this
    process, before its first op, and return the count. ``OMP_NUM_THREADS`` does not decide
    it, but is set to it: Lightning's launcher (``fabric.launch()``) sets torch's threads to
    cores // local processes where that variable is unset, and the processes this one
    starts (workers, compile workers) start with the same count.

    Inter-op threads (``torch.set_num_interop_threads``) are left alone: they run whole ops
    side by side (TorchScript forks) and change no op's result, and torch refuses the call
    once any inter-op work started.
    """
    import torch

    threads = threads_per_rank(trainer)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads
