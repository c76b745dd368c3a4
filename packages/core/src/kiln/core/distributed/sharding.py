"""FSDP2 sharding through Fabric: ``trainer.strategy=fsdp``.

Fabric's ``ModelParallelStrategy`` hands the module and a device mesh to
:func:`shard_module`, which calls ``torch.distributed.fsdp.fully_shard`` on each repeated
block (found as regional compile finds them: ``compile.repeated_blocks``; blocks that
activation checkpointing wrapped are found the same way) and then on the root. Each rank
then holds 1/N of every parameter, its gradient and its optimizer state; a block's
parameters are gathered for its forward and backward only. The order is torchtitan's:
activation checkpointing and regional compile change the blocks before this runs, and a
whole-model ``torch.compile`` is applied by Fabric after it.

Mixed precision follows ``trainer.precision``: ``bf16-mixed`` gathers parameters in bf16
and reduces gradients in fp32 (``MixedPrecisionPolicy``) while the sharded master weights
and the optimizer stay fp32; ``bf16-true`` keeps everything in bf16; ``32-true`` and
``64-true`` are plain.

On one process (``trainer.devices=1``, not started by a launcher) the mesh has one rank:
every parameter is one whole shard, nothing is split or communicated, and the code path
and the checkpoint format (torch distributed checkpoint) are those of N ranks, so a sharded
checkpoint resumes there and one written there resumes on N. kiln joins a process group of
one rank itself (:func:`join_one_process_group`: an in-memory store, no port, no launcher
environment left behind) and keeps it for the process's life, as a worker of N ranks does:
the module's parameters stay DTensors on that group after ``fit``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments.lightning import LightningEnvironment
from torch import nn

from kiln.core.blocks import repeated_blocks
from kiln.core.config import CPU_OFFLOAD_NEEDS_CUDA, FSDPConfig, TrainerConfig

log = logging.getLogger(__name__)


def is_sharded(strategy: Any) -> bool:
    """Whether ``strategy`` (a Fabric strategy) shards the model with FSDP2."""
    from lightning.fabric.strategies.model_parallel import ModelParallelStrategy

    return isinstance(strategy, ModelParallelStrategy)


def fsdp_strategy(trainer: TrainerConfig) -> Any:
    """Fabric's ``ModelParallelStrategy`` doing pure FSDP2 (no tensor parallelism): every
    rank is a data-parallel rank, and checkpoints are written shard by shard."""
    from lightning.fabric.strategies.model_parallel import ModelParallelStrategy

    world = trainer.devices * trainer.num_nodes
    if world == 1:
        log.info(
            "trainer.strategy=fsdp on one process: a mesh of one rank shards nothing (each "
            "parameter is one whole shard); the checkpoints are sharded ones, which resume on "
            "any number of processes"
        )
    return ModelParallelStrategy(
        parallelize_fn=partial(
            shard_module,
            options=trainer.fsdp,
            precision=trainer.precision,
            num_nodes=trainer.num_nodes,
        ),
        data_parallel_size=world,
        tensor_parallel_size=1,
        save_distributed_checkpoint=True,
    )


def shard_module(
    module: nn.Module, device_mesh: Any, options: FSDPConfig, precision: str, num_nodes: int
) -> nn.Module:
    """``fully_shard`` each repeated block of ``module``, then ``module`` itself (in place).

    Rank 0's weights are broadcast first, so every rank shards the same model (what DDP's
    setup guarantees too). A module without repeated blocks is sharded as one unit (its
    whole parameters are gathered at once), and a warning says so.

    Args:
        module: The (precision-converted) module Fabric sets up.
        device_mesh: Fabric's mesh (``data_parallel`` x ``tensor_parallel`` of size 1).
        options: ``trainer.fsdp``.
        precision: ``trainer.precision``.
        num_nodes: ``trainer.num_nodes`` (the replicate dimension of hybrid sharding).

    Returns:
        ``module``, sharded.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    mesh = _mesh(device_mesh, options.sharding, num_nodes)
    _broadcast_from_rank0(module, mesh.device_type)
    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": options.reshard_after_forward}
    if precision == "bf16-mixed":  # bf16 compute and gather, fp32 reduce and master weights
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    if options.cpu_offload:
        if mesh.device_type != "cuda":  # accelerator=auto on a machine without a GPU
            raise ValueError(CPU_OFFLOAD_NEEDS_CUDA.format(mesh.device_type))
        kwargs["offload_policy"] = CPUOffloadPolicy()
    blocks = repeated_blocks(module)
    if not blocks and mesh.size() > 1:  # on one rank nothing is gathered anyway
        log.warning(
            "trainer.strategy=fsdp: %s has no repeated blocks (an nn.ModuleList or "
            "nn.Sequential of modules of one class), so it is sharded as one unit: every "
            "parameter is gathered at once for the forward and the backward. Memory at rest "
            "is still 1/%d per rank; peak memory holds the whole model once",
            type(module).__name__,
            mesh.size(),
        )
    for block in blocks:
        fully_shard(block, **kwargs)
    fully_shard(module, **kwargs)
    log.info("trainer.strategy=fsdp: %d blocks and the root sharded over %s", len(blocks), mesh)
    return module


class OneProcessEnvironment(LightningEnvironment):
    """The cluster environment of an FSDP run on one process that no launcher started.

    Fabric's own would "launch" it: its script launcher sets ``LOCAL_RANK`` and
    ``WORLD_SIZE`` in this process's environment, after which the process looks like one
    rank of a torchrun job (``kiln.core.launch`` would then run a later job of N ranks
    in-process). Here there is nothing to start: this process is the job.
    """

    @property
    def creates_processes_externally(self) -> bool:
        return True


def one_process_environment(trainer: TrainerConfig) -> OneProcessEnvironment | None:
    """:class:`OneProcessEnvironment` for ``trainer.strategy=fsdp`` on one process that no
    launcher started (torchrun's or SLURM's environment is right for theirs), else ``None``."""
    from kiln.core.distributed.launch import launched_externally

    if trainer.strategy != "fsdp" or trainer.devices * trainer.num_nodes > 1:
        return None
    return None if launched_externally() else OneProcessEnvironment()


def join_one_process_group(fabric: Any) -> None:
    """Join a process group of one rank (gloo, or NCCL on a GPU) on an in-memory store,
    before ``fabric.launch`` would open one on a TCP port, when ``fabric`` runs in a
    :class:`OneProcessEnvironment`: FSDP2 needs a group even when there is nobody to talk
    to. A group this process already has is kept."""
    environment = getattr(fabric.strategy, "cluster_environment", None)  # one device: none
    if not isinstance(environment, OneProcessEnvironment) or dist.is_initialized():
        return
    device = fabric.strategy.root_device
    backend = "nccl" if device.type == "cuda" else "gloo"
    store = dist.HashStore()  # pyright: ignore[reportPrivateImportUsage]
    dist.init_process_group(backend, store=store, rank=0, world_size=1)


def _mesh(device_mesh: Any, sharding: str, num_nodes: int) -> Any:
    """The 1-D mesh of full sharding, or hybrid's 2-D (replicate across nodes, shard within)."""
    flat = device_mesh["data_parallel"]
    if sharding == "full":
        return flat
    from torch.distributed.device_mesh import init_device_mesh

    world = flat.size()
    return init_device_mesh(
        flat.device_type,
        (num_nodes, world // num_nodes),
        mesh_dim_names=("replicate", "shard"),
    )


def _broadcast_from_rank0(module: nn.Module, device_type: str) -> None:
    """Rank 0's parameters and buffers on every rank, one tensor at a time through the
    collective's device (the module is still on the CPU here: NCCL needs a GPU copy, and
    the whole model need not fit one device)."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    device = torch.device(device_type)
    if device_type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    for tensor in [*module.parameters(), *module.buffers()]:
        if tensor.device.type == "meta":
            continue
        staged = tensor.data.to(device)  # no copy where it already lives there
        dist.broadcast(staged, src=0)
        if staged.data_ptr() != tensor.data_ptr():
            tensor.data.copy_(staged)


def through_root(model: Any, name: str) -> Callable[..., Any]:
    """``model.<name>`` (a step hook of the module Fabric set up) called through the root
    module's ``__call__``, so FSDP2's root hooks run around it: they gather the root's own
    parameters (embeddings, heads) and queue their gradients' reduce-scatter. Fabric only
    routes step hooks through ``forward`` when the strategy wrapped the module in another
    object (DDP, compile); FSDP2 shards it in place.
    """
    original = model.module

    def call(*args: Any, **kwargs: Any) -> Any:
        had_own = "forward" in original.__dict__
        saved = original.__dict__.get("forward")

        def redirected(*a: Any, **k: Any) -> Any:
            _restore(original, had_own, saved)  # the hook may call the real forward
            return getattr(original, name)(*a, **k)

        original.forward = redirected
        try:
            return model(*args, **kwargs)
        finally:
            _restore(original, had_own, saved)

    return call


def _restore(module: nn.Module, had_own: bool, saved: Any) -> None:
    if had_own:
        module.forward = saved
    else:
        module.__dict__.pop("forward", None)
