"""kiln's training loop: a plain Fabric loop over a LightningModule (no Trainer).

    fabric = L.Fabric(precision=..., devices=..., strategy=...)
    model = fabric.setup_module(torch.compile(module))        # compile before setup
    for window in windows_of(train_loader, accumulate_grad_batches):
        total = all_reduce(sum(count_items(b) for b in window))  # items in the window, all ranks
        for batch in window:                                    # no DDP sync but on the last
            out = model.training_step(batch, i)
            fabric.backward(out["loss"] * out["num_items"] * world_size / total)
        clip; optimizer.step(); scheduler.step(); zero_grad; global_step += 1

The update of a window therefore equals the update of one batch holding all of its items.
"""

from __future__ import annotations

import math
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins import Precision
from lightning.pytorch.utilities.model_helpers import is_overridden

from kiln.core.checkpoint import (
    capture_rng_state,
    find_latest_checkpoint,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from kiln.core.config import CompileConfig, TrainerConfig
from kiln.core.contract import count_items, default_count_items
from kiln.core.data import dataset_size, gather_in_order, set_epoch, training_loader
from kiln.core.launch import check_world_size, launched_externally
from kiln.core.precision import ExactDoublePrecision
from kiln.core.progress import Progress
from kiln.core.seeding import seed_rank_streams
from kiln.core.telemetry import CompileWatch, StepTimer, peak_memory_mb


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite; the run stops before saving it."""


class NonFiniteGradientError(NonFiniteLossError):
    """The gradient norm became NaN or infinite under gradient clipping."""


class EmptyWindowError(ValueError):
    """A window's micro-batches hold no items to average over (e.g. every label is -100)."""


@dataclass
class FitResult:
    """What a run returns (on every rank)."""

    global_step: int
    epoch: int
    metrics: dict[str, float] = field(default_factory=dict)
    train_loss: float | None = None
    telemetry: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    checkpoint: str | None = None


def fit(
    module: L.LightningModule,
    trainer: TrainerConfig,
    compile: CompileConfig | None = None,
    *,
    loggers: Sequence[Any] | None = None,
    callbacks: Sequence[Any] | None = None,
    plugins: Sequence[Any] | None = None,
    run_config: dict[str, Any] | None = None,
) -> FitResult:
    """Train ``module`` (see ``kiln.core.contract``) as ``trainer`` and ``compile`` say.

    Args:
        module: A LightningModule following kiln's module contract.
        trainer: What the loop does (steps, accumulation, precision, devices, checkpoints).
        compile: How ``torch.compile`` is applied; ``None`` trains eagerly.
        loggers: Fabric loggers (``fabric.log_dict`` goes to each; only rank 0 writes).
        callbacks: Extra objects whose ``on_*`` hooks are called with the module's.
        plugins: Extra Fabric plugins; a precision plugin replaces ``trainer.precision``.
        run_config: The run's configuration, stored in every checkpoint.

    Returns:
        The final step, validation metrics, telemetry and logged history.

    Raises:
        NonFiniteLossError: The loss (or, with clipping, the gradient norm:
            ``NonFiniteGradientError``) became NaN or infinite; the message names the step.
        EmptyWindowError: A window counted zero items over all ranks.

    Any exception raised out of ``fit`` after training started carries the run's progress
    as ``error.kiln_result``: a :class:`FitResult` whose ``global_step`` is the optimizer
    steps taken and whose ``history`` holds the rows logged before the failure.
    """
    # Global switch: restored afterwards, so one job of a sweep cannot leak it to the next.
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    if trainer.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it
        torch.use_deterministic_algorithms(True)
    run = _RunState()
    try:
        return _fit(
            module,
            trainer,
            compile or CompileConfig(),
            loggers,
            callbacks,
            plugins,
            run_config,
            run,
        )
    except BaseException as error:
        # what callers report for a failed job: the steps done and what was logged
        error.kiln_result = FitResult(  # type: ignore[attr-defined]
            global_step=run.global_step,
            epoch=run.epoch,
            metrics=dict(run.metrics),
            train_loss=run.history[-1]["train/loss"] if run.history else None,
            history=list(run.history),
            checkpoint=run.checkpoint,
        )
        raise
    finally:
        torch.use_deterministic_algorithms(was_deterministic)


def _fit(
    module: L.LightningModule,
    trainer: TrainerConfig,
    compile: CompileConfig,
    loggers: Sequence[Any] | None,
    callbacks: Sequence[Any] | None,
    plugins: Sequence[Any] | None,
    run_config: dict[str, Any] | None,
    run: _RunState,
) -> FitResult:
    fabric = _build_fabric(trainer, loggers, [module, *(callbacks or [])], plugins)
    fabric.launch()  # sets up the process group; processes were started by kiln.core.launch
    check_world_size(fabric, trainer)  # the world that trains is the one the config records
    fabric.seed_everything(trainer.seed)

    train_loader = training_loader(module.train_dataloader(), fabric, trainer.seed)
    val_loader = _val_loader(module, fabric)
    accumulate = trainer.accumulate_grad_batches
    batches_per_epoch = len(train_loader)
    windows_per_epoch = math.ceil(batches_per_epoch / accumulate)
    if windows_per_epoch == 0:
        raise ValueError(
            "train_dataloader() yields no batches on this rank: the dataset is smaller than "
            "batch_size x devices (with drop_last)"
        )
    total_steps = trainer.max_steps
    if trainer.max_epochs is not None:
        total_steps = min(total_steps, windows_per_epoch * trainer.max_epochs)
    module.total_steps = total_steps  # for warm-up/decay schedules, read in configure_optimizers

    watch = CompileWatch(compile.recompile_warn_threshold)
    watch.start()
    to_setup = (
        torch.compile(module, **compile.torch_compile_kwargs()) if compile.enabled else module
    )
    model = fabric.setup_module(to_setup)  # Fabric re-applies compile outside the DDP wrapper
    # Weights are now rank 0's on every rank (DDP broadcasts parameters and buffers); from
    # here each rank draws its own dropout/augmentation stream (restored on resume).
    seed_rank_streams(trainer.seed, fabric.global_rank)
    optimizer, scheduler = _optimizers(module.configure_optimizers())
    optimizer = fabric.setup_optimizers(optimizer)
    scaler = getattr(fabric.strategy.precision, "scaler", None)  # set with 16-mixed only

    objects = {"model": model, "optimizer": optimizer}
    if scheduler is not None:
        objects["scheduler"] = scheduler
    if scaler is not None:
        objects["scaler"] = scaler
    resume_rng = None
    ckpt = _checkpoint_to_resume(trainer)
    if ckpt is not None:
        rest = load_checkpoint(fabric, ckpt, objects)
        run.load(rest)
        resume_rng = rest["rng"]
        fabric.print(f"resumed from {ckpt} at step {run.global_step}")

    timer = StepTimer()
    progress = Progress(
        total_steps, enabled=trainer.progress and fabric.is_global_zero, start_step=run.global_step
    )
    run.counts_tokens = bool(getattr(module, "items_are_tokens", False))
    start_step = run.global_step
    done = start_step >= total_steps
    fabric.call("on_fit_start")
    model.train()
    with progress:
        while not done:
            set_epoch(train_loader, trainer.seed, run.epoch)
            fabric.call("on_train_epoch_start")
            batches = iter(train_loader)
            if resume_rng is not None:
                # Skip what the checkpointed run had consumed, then restore its RNG streams.
                for _ in islice(batches, run.batch_in_epoch):
                    pass
                restore_rng_state(resume_rng)
                resume_rng = None
            for window in _windows(batches, accumulate):
                started = _clock_start(fabric.device)
                loss_sum, total = _train_window(
                    fabric,
                    model,
                    module,
                    window,
                    run.batch_in_epoch,
                    check=run.global_step == start_step,  # once: count_items vs num_items
                )
                step = run.global_step + 1
                grad_norm, skipped, run.lr = _optimizer_step(
                    fabric, model, optimizer, scheduler, scaler, trainer, step, total
                )
                run.skipped_steps += skipped
                run.global_step += 1
                run.batch_in_epoch += len(window)
                if run.batch_in_epoch >= batches_per_epoch:
                    fabric.call("on_train_epoch_end")
                    run.epoch += 1
                    run.batch_in_epoch = 0
                samples = sum(default_count_items(b) for b in window) * fabric.world_size
                run.pending.append(_Pending(step, loss_sum, total, _clock_stop(started), samples))

                done = run.global_step >= total_steps
                if done or _every(run.global_step, trainer.log_every_n_steps):
                    row = _log_train(fabric, run, timer, grad_norm)
                    progress.update(
                        run.global_step,
                        row["train/loss"],
                        timer.recent_samples_per_s(trainer.log_every_n_steps),
                    )
                    watch.check()
                else:
                    progress.update(run.global_step, None, None)
                if done or _every(run.global_step, trainer.val_every_n_steps):
                    run.metrics = _validate(fabric, model, module, val_loader, trainer, run)
                if trainer.checkpoint_dir is not None and (
                    done or _every(run.global_step, trainer.checkpoint_every_n_steps)
                ):
                    _flush(fabric, run, timer)  # never save weights after a non-finite loss
                    run.checkpoint = str(
                        save_checkpoint(
                            fabric,
                            trainer.checkpoint_dir,
                            run.global_step,
                            {**objects, **run.state(), "config": run_config},
                            keep_last_k=trainer.keep_last_k,
                        )
                    )
                if done:
                    break
    fabric.call("on_fit_end")

    telemetry = {
        **watch.snapshot(),
        **timer.summary(trainer.warmup_steps),
        "peak_memory_mb": peak_memory_mb(fabric.device),
        "skipped_steps": run.skipped_steps,
    }
    if fabric.is_global_zero and fabric.loggers:
        fabric.log_dict(
            {f"telemetry/{k}": v for k, v in telemetry.items() if isinstance(v, int | float)},
            step=run.global_step,
        )
        for logger in fabric.loggers:
            logger.finalize("success")
    return FitResult(
        global_step=run.global_step,
        epoch=run.epoch,
        metrics=run.metrics,
        train_loss=run.history[-1]["train/loss"] if run.history else None,
        telemetry=telemetry,
        history=run.history,
        checkpoint=run.checkpoint,
    )


@dataclass
class _Pending:
    """A step whose loss still lives on the device; the host reads it at the next sync point."""

    step: int
    loss_sum: torch.Tensor  # this rank's sum of per-item losses over the window
    total: int | torch.Tensor  # items in the window over all ranks
    seconds: Callable[[], float]  # the step's duration, read at the sync point
    samples: int


@dataclass
class _RunState:
    """Where the run stands; everything here but ``pending`` goes into checkpoints."""

    global_step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # micro-batches of the current epoch already trained on
    skipped_steps: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    checkpoint: str | None = None
    pending: list[_Pending] = field(default_factory=list)  # steps not yet synced to the host
    counts_tokens: bool = False  # the module's items are tokens: report tokens/s
    lr: float | None = None  # the learning rate the latest step used

    def state(self) -> dict[str, Any]:
        return {
            "global_step": self.global_step,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "skipped_steps": self.skipped_steps,
            "history": list(self.history),
            "metrics": dict(self.metrics),
        }

    def load(self, state: dict[str, Any]) -> None:
        for key in ("global_step", "epoch", "batch_in_epoch", "skipped_steps"):
            setattr(self, key, int(state[key]))
        self.history = list(state.get("history", []))
        self.metrics = dict(state.get("metrics", {}))


def _build_fabric(
    trainer: TrainerConfig,
    loggers: Sequence[Any] | None,
    callbacks: list[Any],
    plugins: Sequence[Any] | None,
) -> L.Fabric:
    world = trainer.devices * trainer.num_nodes
    if world > 1 and not launched_externally():
        raise RuntimeError(
            f"trainer.devices={trainer.devices} x num_nodes={trainer.num_nodes} needs one process "
            "per device: start them with kiln.core.launch(fn, nprocs, ...), torchrun or SLURM"
        )
    plugins = list(plugins or [])
    has_precision = any(isinstance(p, Precision) for p in plugins)
    if not has_precision and trainer.precision == "64-true":
        plugins.append(ExactDoublePrecision())  # Fabric's own rounds step outputs to fp32
        has_precision = True
    strategy = trainer.strategy
    if strategy == "auto" and world > 1:
        strategy = "ddp"
    return L.Fabric(
        accelerator=trainer.accelerator,
        devices=trainer.devices,
        num_nodes=trainer.num_nodes,
        strategy=strategy,
        precision=None if has_precision else trainer.precision,
        plugins=plugins or None,
        loggers=list(loggers or []),
        callbacks=callbacks,
    )


def _val_loader(module: L.LightningModule, fabric: L.Fabric):
    # Validation is optional: LightningModule's own val_dataloader raises (a
    # MisconfigurationException), so only a hook the module defines is called.
    if isinstance(module, L.LightningModule) and not is_overridden(
        "val_dataloader", module, L.LightningModule
    ):
        return None
    hook = getattr(module, "val_dataloader", None)
    try:
        loader = hook() if callable(hook) else None
    except NotImplementedError:
        return None
    return fabric.setup_dataloaders(loader) if loader is not None else None


def _optimizers(configured: Any) -> tuple[torch.optim.Optimizer, Any]:
    """Accepts an optimizer or Lightning's ``{"optimizer", "lr_scheduler"}`` dict."""
    if isinstance(configured, torch.optim.Optimizer):
        return configured, None
    if isinstance(configured, dict) and isinstance(
        configured.get("optimizer"), torch.optim.Optimizer
    ):
        scheduler = configured.get("lr_scheduler")
        if isinstance(scheduler, dict):
            scheduler = scheduler["scheduler"]
        return configured["optimizer"], scheduler
    raise TypeError(
        "configure_optimizers() must return an optimizer or "
        f"{{'optimizer': opt, 'lr_scheduler': sched}}, got {type(configured).__name__}"
    )


def _checkpoint_to_resume(trainer: TrainerConfig) -> Path | None:
    if trainer.resume is None:
        return None
    if trainer.resume == "auto":
        return find_latest_checkpoint(trainer.checkpoint_dir)
    path = Path(trainer.resume)
    if not path.is_file():
        raise FileNotFoundError(f"trainer.resume={trainer.resume!r}: no such checkpoint file")
    return path


def _windows(batches: Iterator[Any], size: int) -> Iterator[list[Any]]:
    """Pre-fetch ``size`` micro-batches at a time; the epoch's last window may be shorter."""
    while window := list(islice(batches, size)):
        yield window


def _train_window(
    fabric: L.Fabric,
    model: Any,
    module: L.LightningModule,
    window: list[Any],
    first_batch_idx: int,
    check: bool,
) -> tuple[torch.Tensor, int | torch.Tensor]:
    """Forward and backward every micro-batch of a window; returns (loss sum, item total).

    Each micro-batch's mean loss is weighted by its share of the window's items over all
    ranks, so the accumulated gradient is that of one batch holding the whole window.
    """
    world, device = fabric.world_size, fabric.device
    counts = [count_items(module, batch) for batch in window]
    total: int | torch.Tensor
    if world == 1 and all(isinstance(c, int) for c in counts):
        total = sum(counts)  # host integers: no device work on the common one-process path
    else:
        total = torch.stack([_as_tensor(c, device) for c in counts]).sum()
        if world > 1:
            total = fabric.all_reduce(total, reduce_op="sum")
    loss_sum = torch.zeros((), device=device, dtype=_count_dtype(device))
    for j, batch in enumerate(window):
        # Gradients are all-reduced once per window, on its last micro-batch.
        with fabric.no_backward_sync(model, enabled=j < len(window) - 1):
            loss, n = _unpack_step(
                _call(fabric, model, "training_step", batch, first_batch_idx + j)
            )
            if check:
                _check_counts(n, counts[j])
            # DDP averages gradients over ranks, hence * world: the sum runs over all items.
            fabric.backward(_weighted(loss, n, world, total))
        loss_sum += loss.detach().to(loss_sum.dtype) * n
    return loss_sum, total


def _weighted(loss: torch.Tensor, n: Any, world: int, total: Any) -> torch.Tensor:
    """``loss * n * world / total``, kept at least fp32 (also for a bf16/fp16 loss)."""
    loss = loss.to(torch.promote_types(loss.dtype, torch.float32))
    if isinstance(n, int) and isinstance(total, int):
        weight = n * world / total  # exact host arithmetic; 1.0 needs no multiply at all
        return loss if weight == 1.0 else loss * weight
    weight = _as_tensor(n, loss.device) * world / _as_tensor(total, loss.device)
    return loss * weight.to(loss.dtype)


def _optimizer_step(
    fabric: L.Fabric,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    scaler: Any,
    trainer: TrainerConfig,
    step: int,
    total: int | torch.Tensor,
) -> tuple[torch.Tensor | None, bool, float]:
    """Clip, step, schedule, zero.

    Returns:
        The grad norm (with clipping), whether the GradScaler skipped the step, and the
        learning rate the step used (read before the scheduler moves it on).
    """
    if isinstance(total, int):
        _check_total(total, step)  # host integer: free to check before the update
    grad_norm = None
    if trainer.gradient_clip_norm is not None:
        try:
            # inf/NaN gradients are expected with 16-mixed: the GradScaler skips those steps
            grad_norm = fabric.clip_gradients(
                model,
                optimizer,
                max_norm=trainer.gradient_clip_norm,
                error_if_nonfinite=scaler is None,
            )
        except RuntimeError as error:
            if "non-finite" not in str(error):
                raise
            _check_total(int(total), step)  # an empty window makes 0/0 gradients
            raise NonFiniteGradientError(
                f"gradient norm is {_grad_norm(optimizer)} at step {step} (before clipping to "
                f"trainer.gradient_clip_norm={trainer.gradient_clip_norm}); stopping before it "
                "reaches a checkpoint (the last good checkpoint stays)"
            ) from error
    lr = _lr(optimizer)
    scale_before = scaler.get_scale() if scaler is not None else None
    optimizer.step()
    # note: get_scale() is a host sync, paid only with 16-mixed's GradScaler. A lower scale
    # means it found inf/NaN gradients and skipped the update: the schedule must not advance.
    skipped = scaler is not None and scaler.get_scale() < scale_before
    if scheduler is not None and not skipped:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, skipped, lr


def _lr(optimizer: Any) -> float:
    lr = optimizer.param_groups[0]["lr"]
    return float(lr)  # a tensor lr (for compiled optimizers) is read only here


def _grad_norm(optimizer: Any) -> float:
    """The global 2-norm of the gradients (on a failure path: a host sync is fine)."""
    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    if not grads:
        return float("nan")
    return float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))


def _check_total(total: int, step: int) -> None:
    if total == 0:
        raise EmptyWindowError(
            f"the window of micro-batches for step {step} counts 0 items over all ranks "
            "(count_items(batch) summed to 0: e.g. every label is -100), so it has no mean "
            "loss; each window needs at least 1 item: filter out batches with no label tokens"
        )


def _clock_start(device: torch.device) -> Any:
    """Start timing a step without a host sync: a CUDA event on the GPU's stream (the gap
    between two events includes launch bubbles), ``perf_counter`` elsewhere."""
    if device.type == "cuda":
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def _clock_stop(started: Any) -> Callable[[], float]:
    """Stop timing; the returned function gives the seconds once the host has synced."""
    if isinstance(started, float):
        seconds = time.perf_counter() - started
        return lambda: seconds
    end = torch.cuda.Event(enable_timing=True)
    end.record()

    def elapsed() -> float:
        end.synchronize()
        return started.elapsed_time(end) / 1000.0  # milliseconds

    return elapsed


def _call(fabric: L.Fabric, model: Any, hook: str, *args: Any) -> Any:
    """Call a step hook under Fabric's precision (autocast, input/output dtypes).

    Fabric applies precision in ``forward``; it routes step hooks through ``forward`` only
    when the module is wrapped (DDP, compile), so on one eager device bf16-mixed would
    silently run in fp32. Applying it here too is harmless when Fabric already did.
    """
    precision = fabric.strategy.precision
    args = precision.convert_input(args)
    with precision.forward_context():
        out = getattr(model, hook)(*args)
    return precision.convert_output(out)


def _unpack_step(out: Any) -> tuple[torch.Tensor, Any]:
    if not isinstance(out, dict) or "loss" not in out or "num_items" not in out:
        raise TypeError(
            "training_step must return {'loss': mean loss, 'num_items': items it averaged "
            f"over}}, got {type(out).__name__}"
            + (f" with keys {sorted(out)}" if isinstance(out, dict) else "")
        )
    return out["loss"], out["num_items"]


def _count_dtype(device: torch.device) -> torch.dtype:
    """Item counts as exact floats: float64 holds any count (MPS has no float64)."""
    return torch.float32 if device.type == "mps" else torch.float64


def _as_tensor(value: Any, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(value, device=device).to(_count_dtype(device))


def _check_counts(reported: Any, counted: Any) -> None:
    """Once per run: the count that weighted the loss is the count the step averaged over."""
    if int(reported) != int(counted):
        raise ValueError(
            f"training_step reported num_items={int(reported)} but count_items(batch) gives "
            f"{int(counted)}; define count_items(batch) on the module to count what the loss "
            "averages over (e.g. non-padding label tokens)"
        )


def _every(step: int, period: int | None) -> bool:
    return period is not None and step % period == 0


def _flush(fabric: L.Fabric, run: _RunState, timer: StepTimer) -> list[tuple[int, float]]:
    """Bring pending window losses to the host (a sync point) and stop on a non-finite one."""
    if not run.pending:
        return []
    pending, run.pending = run.pending, []
    sums = torch.stack([p.loss_sum for p in pending])
    if fabric.world_size > 1:
        sums = fabric.all_reduce(sums, reduce_op="sum")
    totals = torch.stack([_as_tensor(p.total, sums.device) for p in pending])
    losses = (sums / totals).tolist()
    for p, total in zip(pending, totals.tolist(), strict=True):
        _check_total(int(total), p.step)  # before the NaN that 0/0 makes is reported
    for p, total in zip(pending, totals.tolist(), strict=True):
        timer.record(p.seconds(), p.samples, int(total) if run.counts_tokens else None)
    for p, value in zip(pending, losses, strict=True):
        if not math.isfinite(value):
            raise NonFiniteLossError(
                f"loss is {value} at step {p.step}; stopping before it reaches a checkpoint "
                "(the last good checkpoint stays)"
            )
    return [(p.step, value) for p, value in zip(pending, losses, strict=True)]


def _log_train(
    fabric: L.Fabric, run: _RunState, timer: StepTimer, grad_norm: Any
) -> dict[str, Any]:
    step, loss = _flush(fabric, run, timer)[-1]
    row: dict[str, Any] = {
        "step": step,
        "train/loss": loss,
        "train/lr": run.lr,  # the rate this step used, not the one the scheduler set next
        "train/skipped_steps": run.skipped_steps,
    }
    if grad_norm is not None:
        row["train/grad_norm"] = float(grad_norm)
    run.history.append(row)
    fabric.log_dict({k: v for k, v in row.items() if k != "step"}, step=step)
    return row


def _validate(
    fabric: L.Fabric,
    model: Any,
    module: L.LightningModule,
    loader: Any,
    trainer: TrainerConfig,
    run: _RunState,
) -> dict[str, float]:
    if loader is None or not callable(getattr(module, "validation_step", None)):
        return run.metrics
    fabric.call("on_validation_start")
    # Validation must not shift training's random streams (a val loader's iterator draws a
    # seed), so a run validated at step N trains exactly as one that was not.
    rng = capture_rng_state()
    model.eval()
    outputs: dict[str, list[torch.Tensor]] = defaultdict(list)
    with torch.no_grad():
        for i, batch in enumerate(loader):
            if trainer.limit_val_batches is not None and i >= trainer.limit_val_batches:
                break
            for key, value in _call(fabric, model, "validation_step", batch, i).items():
                outputs[key].append(value.detach())
    model.train()
    restore_rng_state(rng)
    size = dataset_size(loader)
    gathered = {k: gather_in_order(fabric, torch.cat(v), size) for k, v in outputs.items()}
    compute = getattr(module, "validation_metrics", None)
    if callable(compute):
        metrics = compute(gathered)
    elif "loss" in gathered:
        metrics = {"loss": gathered["loss"].float().mean().item()}
    else:
        raise TypeError("define validation_metrics(outputs) on the module, or return 'loss'")
    metrics = {f"val/{k}": float(v) for k, v in metrics.items()}
    fabric.log_dict(metrics, step=run.global_step)
    fabric.call("on_validation_end")
    return metrics
