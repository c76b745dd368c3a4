"""What the examples share: offline settings, the fit call, and the printed summary."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

# The examples run offline: packaged model, generated or scikit-learn data, local metrics.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def trainer_arguments(parser: argparse.ArgumentParser, steps: int, lr: float) -> None:
    parser.add_argument("--max-steps", type=int, default=steps, help="optimizer steps")
    parser.add_argument("--lr", type=float, default=lr, help="peak learning rate")
    parser.add_argument("--warmup-ratio", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--precision", default="32-true", help="Fabric precision")
    parser.add_argument("--compile", default="none", help="compile mode (none, default, ...)")


def run(module: Any, args: argparse.Namespace, description: str) -> dict[str, float]:
    """Train ``module`` with kiln.core's loop and print the validation figures."""
    import torch

    from kiln.core import CompileConfig, TrainerConfig, fit

    trainer = TrainerConfig(
        max_steps=args.max_steps,
        accelerator="cpu",
        precision=args.precision,
        seed=args.seed,
        log_every_n_steps=max(1, args.max_steps // 10),
        progress=False,
    )
    start = time.perf_counter()
    result = fit(module, trainer=trainer, compile_config=CompileConfig(mode=args.compile))
    wall = time.perf_counter() - start
    print(f"\n{description}")
    threads = torch.get_num_threads()
    print(f"  steps: {result.global_step}  epochs: {result.epoch}  torch threads: {threads}")
    for key, value in sorted(result.metrics.items()):
        print(f"  {key}: {value:.4f}")
    print(f"  train loss (last logged): {result.train_loss}")
    print(f"  wall time (fit, incl. data prep and validation): {wall:.1f} s")
    return result.metrics
