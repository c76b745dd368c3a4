"""One process of a training job: build the model from the resolved config and ``fit`` it.

The job never re-executes ``sys.argv``. With ``trainer.devices > 1`` it starts its worker
processes itself through ``kiln.core.launch``, handing each the validated config (a pickled
``TrainConfig``) and the resolved one (what checkpoints record); each worker builds the model
and data from it and calls ``kiln.core.fit``. When the
processes already exist (``torchrun``, or SLURM with one task per device) the job *is* a
worker: it trains in-process, and only global rank 0 tracks and writes.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from typing import TYPE_CHECKING, Any

from kiln.experiments.settings.build import build_module, seed_before_build
from kiln.experiments.train.preflight import check_test_split

if TYPE_CHECKING:
    from kiln.experiments.train.train_config import TrainConfig


def global_rank() -> int:
    """This process's global rank as the launcher set it (0 when there is one process)."""
    for var in ("RANK", "SLURM_PROCID"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


def build_callbacks(specs: dict[str, Any] | None) -> list[Any]:
    """The ``callbacks`` config group's objects, in name order (``null`` entries dropped)."""
    from hydra.utils import instantiate

    specs = specs or {}
    for name, spec in specs.items():
        if spec is not None and "_target_" not in spec:
            raise ValueError(
                f"callbacks.{name} has no _target_; each callback is a _target_ (e.g. "
                "kiln.core.callbacks.EMA) plus its arguments, see configs/callbacks/"
            )
    return [instantiate(specs[name]) for name in sorted(specs) if specs[name] is not None]


def train_worker(
    settings: TrainConfig, resolved: dict[str, Any], loggers: list[Any], module: Any = None
) -> dict[str, Any]:
    """Train as one process of the job; a top-level function so ``kiln.core.launch`` can pickle it.

    Args:
        settings: The job's validated config.
        resolved: The same config as plain containers: what checkpoints record.
        loggers: The job's Fabric loggers; only global rank 0 uses them.
        module: The module ``preflight.build_checked`` built in this process, or ``None``
            to build it here.

    Returns:
        ``kiln.core.FitResult`` as a dict.
    """
    from kiln.core import fit, weights_hash
    from kiln.core.distributed.stop import stop_on_signals
    from kiln.core.distributed.threads import apply_threads_per_rank

    trainer = settings.trainer
    apply_threads_per_rank(trainer)  # a launched worker's first op is building the model
    if module is None:
        seed_before_build(trainer.seed)  # same seed, same starting weights, every rank and job
        module = build_module(settings)
    init_hash = weights_hash(module)
    check_test_split(module, settings)
    if global_rank() == 0:
        for logger in loggers:  # the W&B run's config (a worker process attaches to it)
            try:
                logger.log_hyperparams({"seed": trainer.seed, "init_weights_sha256": init_hash})
            except NotImplementedError:
                pass  # Fabric's CSVLogger keeps no hyperparameters; summary.json has them
    # SIGTERM, Ctrl-C and SLURM's USR2 stop the run at the next step boundary, with a
    # checkpoint there; the job then re-raises the signal (runner.end_after_signal)
    callbacks = build_callbacks(settings.callbacks)
    profiler = None
    if settings.profile is not None and global_rank() == 0:
        from kiln.core.callbacks import StepProfiler

        profiler = StepProfiler(settings.profile)
        callbacks.append(profiler)
    with stop_on_signals():
        result = fit(
            module,
            trainer,
            settings.compile,
            loggers=loggers if global_rank() == 0 else [],
            callbacks=callbacks,
            run_config=resolved,
        )
    record = {
        **dataclasses.asdict(result),
        "init_weights_sha256": init_hash,
        "best_checkpoint": best_checkpoint(callbacks),
        "profile": profiler.result if profiler is not None else None,
    }
    stopped = result.stop_reason == "signal"  # the resumed attempt tests the final weights
    if settings.test_after_fit and global_rank() == 0 and not stopped:
        record["metrics"] = {**record["metrics"], **test_pass(module, result.global_step, loggers)}
    return record


def best_checkpoint(callbacks: list[Any]) -> dict[str, Any] | None:
    """Which step the run's ``BestCheckpoint`` file holds (``None`` without one, or before
    its first save): ``path``, ``step``, ``monitor`` and ``value``."""
    from kiln.core.callbacks import BestCheckpoint

    for callback in callbacks:
        if isinstance(callback, BestCheckpoint) and callback.best_step is not None:
            return {
                "path": str(callback.path),
                "step": callback.best_step,
                "monitor": callback.monitor,
                "value": callback.best,
            }
    return None


def test_pass(module: Any, step: int, loggers: list[Any]) -> dict[str, float]:
    """The trained module's metrics on its data module's test split (``test/<metric>``),
    logged at the run's last step; on rank 0, over the whole split."""
    from kiln.experiments.eval.evaluate import evaluate

    metrics = evaluate(module, "test")
    for logger in loggers:
        logger.log_metrics(metrics, step=step)
    return metrics


def train(
    settings: TrainConfig, resolved: dict[str, Any], loggers: list[Any], module: Any = None
) -> dict[str, Any]:
    """Train the job: in this process (``module``: built already, or ``None``), or in
    ``trainer.devices`` worker processes it starts (each builds its own)."""
    trainer = settings.trainer
    if in_process(trainer):
        return train_worker(settings, resolved, loggers, module)
    if trainer.num_nodes > 1:
        raise ValueError(
            f"trainer.num_nodes={trainer.num_nodes} needs processes on every node: start the "
            "job with torchrun or launcher=slurm (see docs/sweeps-and-slurm.md)"
        )
    return _launch(settings, resolved, loggers)


def in_process(trainer: Any) -> bool:
    """Whether this process trains (one device, or a rank torchrun or SLURM started), rather
    than starting ``trainer.devices`` workers (``trainer``: a ``TrainerConfig``)."""
    from kiln.core.distributed.launch import launched_externally

    # torchrun or SLURM tasks: this process is already one rank
    return launched_externally() or trainer.devices * trainer.num_nodes == 1


def _launch(settings: TrainConfig, resolved: dict[str, Any], loggers: list[Any]) -> dict[str, Any]:
    """Train on ``trainer.devices`` worker processes started here."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from kiln.core import launch
    from kiln.experiments.jobs.lifecycle import Terminated

    try:
        return launch(train_worker, settings.trainer.devices, settings, resolved, loggers)[0]
    except SignalException as stopped:
        # torch's agent relayed SIGTERM/SIGINT to the workers (they stop at a step boundary,
        # with a checkpoint) and raised here: end as a single-process job would
        if stopped.sigval == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise Terminated(stopped.sigval) from None
