"""The setup stage of ``fit``: Fabric, loaders, compile, optimizers, in that order.

``setup`` returns a :class:`~kiln.core.state.Context`: what stays fixed for the whole run
and what the step, ``LogValidateCheckpoint`` and ``finish`` use.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, cast

import lightning as L
import torch
from lightning.fabric.plugins import ClusterEnvironment, Precision
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.utils.data import DataLoader

from kiln.core.callback_points import CallbackList, CallbackStates
from kiln.core.checkpoints.registry import CheckpointState
from kiln.core.checkpoints.rundir import check_writable
from kiln.core.config import CompileConfig, TrainerConfig
from kiln.core.distributed.launch import check_world_size, launched_externally
from kiln.core.distributed.sharding import (
    fsdp_strategy,
    is_sharded,
    join_one_process_group,
    one_process_environment,
    through_root,
)
from kiln.core.loop.data import training_loader
from kiln.core.loop.optim import unpack_optimizers
from kiln.core.loop.precision import ExactDoublePrecision
from kiln.core.loop.seeding import seed_rank_streams
from kiln.core.loop.stream import (
    STATE_KEY,
    StreamPosition,
    check_stream,
    is_stream,
    stream_batches_per_epoch,
)
from kiln.core.state import Context
from kiln.core.telemetry.memory import reset_peak_memory

log = logging.getLogger(__name__)


def setup(
    module: L.LightningModule,
    trainer: TrainerConfig,
    compile_config: CompileConfig,
    loggers: Sequence[Any] | None,
    callbacks: Sequence[Any] | None,
    plugins: Sequence[Any] | None,
) -> Context:
    """Build Fabric, the loaders, the (compiled) model and the optimizer for ``fit``."""
    fabric = build_fabric(trainer, loggers, [module, *(callbacks or [])], plugins)
    join_one_process_group(fabric)  # FSDP on one process only (sharding.py)
    fabric.launch()  # sets up the process group; processes were started by kiln.core.launch
    check_world_size(fabric, trainer)  # the world that trains is the one the config records
    if trainer.checkpoint_dir is not None:
        check_writable(trainer.checkpoint_dir)  # now, not at the first save hours from now
    fabric.seed_everything(trainer.seed)
    start_memory_mb = reset_peak_memory(fabric.device)  # the fit's own peak, not an earlier job's

    loader = module.train_dataloader()
    if is_stream(loader):
        check_stream(loader, trainer)
    train_loader = training_loader(loader, fabric, trainer.seed)
    val_loader = _val_loader(module, fabric)
    batches_per_epoch = stream_batches_per_epoch(train_loader)
    total_steps = _total_steps(trainer, batches_per_epoch)
    _say_if_every_window_is_partial(fabric, trainer, batches_per_epoch)
    # for warm-up/decay schedules, read in configure_optimizers (nn.Module types __setattr__
    # for tensors and modules only)
    module.total_steps = total_steps  # pyright: ignore[reportArgumentType]

    model = fabric.setup_module(_compiled(module, compile_config))
    sharded = is_sharded(fabric.strategy)
    # Weights are now rank 0's on every rank (DDP broadcasts parameters and buffers, FSDP
    # broadcasts them before sharding: sharding.shard_module); from
    # here each rank draws its own dropout/augmentation stream (restored on resume).
    seed_rank_streams(trainer.seed, fabric.global_rank)
    optimizer, scheduler = unpack_optimizers(module.configure_optimizers())
    ctx = Context(
        fabric=fabric,
        trainer=trainer,
        module=module,
        model=model,
        training_step=through_root(model, "training_step") if sharded else model.training_step,
        optimizer=cast(torch.optim.Optimizer, fabric.setup_optimizers(optimizer)),
        scheduler=scheduler,
        scaler=getattr(fabric.strategy.precision, "scaler", None),  # set with 16-mixed only
        train_loader=train_loader,
        val_loader=val_loader,
        batches_per_epoch=batches_per_epoch,
        total_steps=total_steps,
        has_count_hook=callable(getattr(module, "count_items", None)),
        count_flops=_counts_flops(fabric, module, trainer, sharded),
        callbacks=CallbackList([module, *(callbacks or [])]),
        state=CheckpointState(),
        start_memory_mb=start_memory_mb,
        cuda_graphs=compile_config.uses_cuda_graphs and fabric.device.type == "cuda",
    )
    _register_state(ctx, callbacks or [])
    return ctx


def _register_state(ctx: Context, callbacks: Sequence[Any]) -> None:
    """What setup built that a checkpoint holds: the model and optimizer (torch distributed
    checkpoint reshards them), scheduler, grad scaler, stateful callbacks, a stream's
    position, and whatever the module registers (its ``checkpoint_state()``)."""
    state = ctx.state
    state.register("model", ctx.model)
    state.register("optimizer", ctx.optimizer)
    if ctx.scheduler is not None:
        state.register("scheduler", ctx.scheduler)
    if ctx.scaler is not None:
        state.register("scaler", ctx.scaler)
    stateful = CallbackStates(callbacks)  # callbacks with state_dict(): "callbacks/<key>"
    if stateful:
        state.register("callbacks", stateful)
    if is_stream(ctx.train_loader):  # a stream's position is its own: every rank's
        state.register(STATE_KEY, StreamPosition(ctx.fabric, ctx.train_loader))
    own: Callable[[], dict[str, Any]] | None = getattr(ctx.module, "checkpoint_state", None)
    for key, obj in (own() if callable(own) else {}).items():
        state.register(key, obj)


def build_fabric(
    trainer: TrainerConfig,
    loggers: Sequence[Any] | None,
    callbacks: list[Any],
    plugins: Sequence[Any] | None,
) -> L.Fabric:
    """The run's Fabric, as ``trainer`` says; ``64-true`` gets kiln's exact plugin."""
    world = trainer.devices * trainer.num_nodes
    if world > 1 and not launched_externally():
        raise RuntimeError(
            f"trainer.devices={trainer.devices} x num_nodes={trainer.num_nodes} needs one process "
            "per device: start them with kiln.core.launch(fn, nprocs, ...), torchrun or SLURM"
        )
    plugins = list(plugins or [])
    environment = one_process_environment(trainer)
    if environment is not None and not any(isinstance(p, ClusterEnvironment) for p in plugins):
        plugins.append(environment)
    has_precision = any(isinstance(p, Precision) for p in plugins)
    if not has_precision and trainer.precision == "64-true":
        plugins.append(ExactDoublePrecision())  # Fabric's own rounds step outputs to fp32
        has_precision = True
    return L.Fabric(
        accelerator=trainer.accelerator,
        devices=trainer.devices,
        num_nodes=trainer.num_nodes,
        strategy=select_strategy(trainer),
        # a string TrainerConfig checked, for Fabric to check against its own list (Fabric
        # types it with a Literal of its private module)
        precision=None if has_precision else cast(Any, trainer.precision),
        plugins=plugins or None,
        loggers=list(loggers or []),
        callbacks=callbacks,
    )


def select_strategy(trainer: TrainerConfig) -> Any:
    """The Fabric strategy of ``trainer.strategy``: ``auto`` is ``ddp`` for several processes
    (one device otherwise); ``fsdp`` is FSDP2 through Fabric's ``ModelParallelStrategy``
    (Fabric's own ``"fsdp"`` string means FSDP1, and only on GPUs)."""
    world = trainer.devices * trainer.num_nodes
    if trainer.strategy == "fsdp":
        return fsdp_strategy(trainer)
    if trainer.strategy == "auto" and world > 1:
        return "ddp"
    return trainer.strategy


def _counts_flops(
    fabric: L.Fabric, module: L.LightningModule, trainer: TrainerConfig, sharded: bool
) -> bool:
    wanted = trainer.count_flops and getattr(module, "count_flops", True) is not False
    if wanted and sharded:
        # the meta-device count runs training_step, whose FSDP2 hooks would gather the
        # real shards; the figure would be per rank of a whole model anyway
        if fabric.is_global_zero:
            log.info("FLOPs not counted under trainer.strategy=fsdp (flops_per_step, mfu: None)")
        return False
    return wanted


def _total_steps(trainer: TrainerConfig, batches_per_epoch: int) -> int:
    """The optimizer steps the run will reach: ``max_steps``, or fewer with ``max_epochs``."""
    windows_per_epoch = math.ceil(batches_per_epoch / trainer.accumulate_grad_batches)
    if windows_per_epoch == 0:
        raise ValueError(
            "train_dataloader() yields no batches on this rank: the dataset is smaller than "
            "batch_size x devices (with drop_last)"
        )
    if trainer.max_epochs is None:
        return trainer.max_steps
    return min(trainer.max_steps, windows_per_epoch * trainer.max_epochs)


def _say_if_every_window_is_partial(
    fabric: L.Fabric, trainer: TrainerConfig, batches_per_epoch: int
) -> None:
    # correct (an epoch's last window is stepped on its own items), but rarely what was meant
    accumulate = trainer.accumulate_grad_batches
    if accumulate > batches_per_epoch and fabric.is_global_zero:
        log.warning(
            "trainer.accumulate_grad_batches=%d is more than the %d micro-batches of an epoch "
            "(per rank): every optimizer step is a partial window of %d micro-batches, one "
            "step per epoch (the update of one batch of all %d)",
            accumulate,
            batches_per_epoch,
            batches_per_epoch,
            batches_per_epoch,
        )


def _compiled(module: L.LightningModule, compile_config: CompileConfig) -> Any:
    # compile before fabric.setup: Fabric re-applies it outside the DDP wrapper
    if not compile_config.enabled or compile_config.regional:
        return module  # regional: the blocks were compiled in place (compile.compile_scope)
    return torch.compile(module, **compile_config.torch_compile_kwargs())


def _val_loader(module: L.LightningModule, fabric: L.Fabric) -> DataLoader[Any] | None:
    # Validation is optional: LightningModule's own val_dataloader raises (a
    # MisconfigurationException), so only a hook the module defines is called.
    # fit takes any module that follows the contract, not only LightningModules
    if isinstance(module, L.LightningModule) and not is_overridden(  # pyright: ignore[reportUnnecessaryIsInstance]
        "val_dataloader", module, L.LightningModule
    ):
        return None
    hook: Callable[[], DataLoader[Any]] | None = getattr(module, "val_dataloader", None)
    try:
        loader = hook() if callable(hook) else None
    except NotImplementedError:
        return None
    if loader is None:
        return None
    # one loader in, one out (Fabric annotates it with bare generics)
    return cast(DataLoader[Any], fabric.setup_dataloaders(loader))  # pyright: ignore[reportUnknownMemberType]
