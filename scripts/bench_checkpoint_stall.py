"""How long a checkpoint stalls training: a synchronous save against an asynchronous one,
measured side by side (interleaved rounds) on a model with a few hundred MB of state.

A save's stall is what the step loop loses to it: the time the ``save_checkpoint`` call
blocks, the wait for its write before the next save, and how much slower the ``--steps``
steps after it run than the median step just before it (the write competes for the CPU and
the disk). Prints each mode's median stall per save (min-max), its parts, and the ratio::

    uv run --frozen --all-packages python scripts/bench_checkpoint_stall.py
    uv run --frozen --all-packages python scripts/bench_checkpoint_stall.py --width 2048 --layers 12
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from lightning.fabric import Fabric
from torch import nn

from kiln.core.checkpoints.save import CheckpointWrites, save_checkpoint


def build(width: int, layers: int) -> nn.Module:
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*blocks)


def report(
    parts: dict[str, list[tuple[float, float, float]]],
    step_s: list[float],
    state_mb: float,
    args: argparse.Namespace,
) -> None:
    """Print each mode's stall per save and its parts, and the ratio."""
    print(
        f"model + AdamW state: {state_mb:.0f} MiB; {args.rounds} saves per mode, interleaved, "
        f"each followed by {args.steps} steps (median step {statistics.median(step_s):.3f} s)"
    )
    header = f"{'save':<6} {'stall per save: median (min-max)':>33}"
    print(f"{header}  {'call':>6} {'wait':>6} {'slower steps':>12}")
    stall = {mode: [sum(p) for p in values] for mode, values in parts.items()}
    for mode, values in parts.items():
        call, wait, slower = (statistics.median(v) for v in zip(*values, strict=True))
        low, high = min(stall[mode]), max(stall[mode])
        print(
            f"{mode:<6} {statistics.median(stall[mode]):>17.2f} s ({low:.2f}-{high:.2f})"
            f"      {call:>6.2f} {wait:>6.2f} {slower:>12.2f}"
        )
    ratio = statistics.median(stall["sync"]) / max(statistics.median(stall["async"]), 1e-9)
    print(f"sync / async stall: {ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10, help="steps after each save")
    parser.add_argument("--rounds", type=int, default=5, help="saves per mode, interleaved")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (a temp dir)")
    parser.add_argument("--accelerator", default="cpu", help="cpu or cuda")
    args = parser.parse_args()

    fabric = Fabric(accelerator=args.accelerator, devices=1)
    torch.manual_seed(0)
    model = fabric.setup_module(build(args.width, args.layers))
    optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=1e-4))
    batch = torch.randn(args.batch, args.width, device=fabric.device)

    def step() -> None:
        loss = model(batch).square().mean()
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()

    def timed_steps(n: int) -> list[float]:
        times = []
        for _ in range(n):
            start = time.perf_counter()
            step()
            if fabric.device.type == "cuda":
                torch.cuda.synchronize()  # a step's time, not its launch's
            times.append(time.perf_counter() - start)
        return times

    timed_steps(3)  # warm-up; AdamW's state exists from here on
    state_mb = sum(p.numel() * p.element_size() * 3 for p in model.parameters()) / 2**20
    root = Path(tempfile.mkdtemp(dir=args.dir))
    writes = CheckpointWrites()
    parts: dict[str, list[tuple[float, float, float]]] = {"sync": [], "async": []}
    step_s: list[float] = []
    number = 0
    for _ in range(args.rounds):
        for mode in ("sync", "async"):
            before = statistics.median(timed_steps(5))
            step_s.append(before)
            number += 1
            start = time.perf_counter()
            save_checkpoint(
                fabric,
                root / mode,
                number,
                {"model": model, "optimizer": optimizer},
                keep_last_k=1,
                writes=writes if mode == "async" else None,
            )
            call = time.perf_counter() - start
            slower = sum(t - before for t in timed_steps(args.steps))
            start = time.perf_counter()
            writes.wait(fabric)  # the write ends before the next save (as in the loop)
            parts[mode].append((call, time.perf_counter() - start, slower))

    report(parts, step_s, state_mb, args)


if __name__ == "__main__":
    main()
