"""How long a checkpoint stalls training: a synchronous save against an asynchronous one,
measured side by side (interleaved rounds, with a round that saves nothing) on a model with
a few hundred MB of state.

A round is a step, a save, ``--steps`` more steps and the wait for the write. Per mode:
the step that starts a save (the step and the ``save_checkpoint`` call) over the median
step just before it, the round's total against the round without a save, and the save's
stall: the time the call blocks, the wait for its write before the next save, and how much
slower the steps after it run than that median step (the write competes for the CPU and the
disk). Prints medians (min-max) and the sync / async ratio::

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


def _spread(values: list[float], unit: str = "") -> str:
    med = statistics.median(values)
    return f"{med:.2f}{unit} ({min(values):.2f}-{max(values):.2f})"


def report(
    rounds: dict[str, list[dict[str, float]]],
    step_s: list[float],
    state_mb: float,
    args: argparse.Namespace,
) -> None:
    """Print each mode's starting step, round total and stall per save, and the ratio."""
    print(
        f"model + AdamW state: {state_mb:.0f} MiB; {args.rounds} rounds per mode, interleaved, "
        f"each a step, a save and {args.steps} steps (median step "
        f"{statistics.median(step_s):.3f} s)"
    )
    print(
        f"{'save':<6} {'step starting it / median':>26} {'round total, s':>20} "
        f"{'stall per save, s':>20} {'call':>6} {'wait':>6} {'slower steps':>12}"
    )
    stall = {m: [r["call"] + r["wait"] + r["slower"] for r in rs] for m, rs in rounds.items()}
    for mode, rs in rounds.items():
        med = {key: statistics.median(r[key] for r in rs) for key in ("call", "wait", "slower")}
        print(
            f"{mode:<6} {_spread([r['starts'] for r in rs], 'x'):>26} "
            f"{_spread([r['total'] for r in rs]):>20} {_spread(stall[mode]):>20} "
            f"{med['call']:>6.2f} {med['wait']:>6.2f} {med['slower']:>12.2f}"
        )
    total = {m: statistics.median(r["total"] for r in rs) for m, rs in rounds.items()}
    ratio = statistics.median(stall["sync"]) / max(statistics.median(stall["async"]), 1e-9)
    print(
        f"sync / async stall: {ratio:.2f}x; round total, sync / async: "
        f"{total['sync'] / total['async']:.2f}x"
    )


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

    bench = Bench(args)
    bench.timed_steps(3)  # warm-up; AdamW's state exists from here on
    params = bench.model.parameters()
    state_mb = sum(p.numel() * p.element_size() * 3 for p in params) / 2**20
    root = Path(tempfile.mkdtemp(dir=args.dir))
    rounds: dict[str, list[dict[str, float]]] = {"none": [], "sync": [], "async": []}
    step_s: list[float] = []
    for number in range(args.rounds):
        for mode, found in rounds.items():
            before = statistics.median(bench.timed_steps(5))
            step_s.append(before)
            found.append(bench.round(mode, root, len(rounds) * number + 1, before, args.steps))
    report(rounds, step_s, state_mb, args)


class Bench:
    """The model, its optimizer and one batch, stepped and saved."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.fabric = Fabric(accelerator=args.accelerator, devices=1)
        torch.manual_seed(0)
        self.model = self.fabric.setup_module(build(args.width, args.layers))
        adamw = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.optimizer = self.fabric.setup_optimizers(adamw)
        self.batch = torch.randn(args.batch, args.width, device=self.fabric.device)
        self.writes = CheckpointWrites()

    def step(self) -> None:
        loss = self.model(self.batch).square().mean()
        self.fabric.backward(loss)
        self.optimizer.step()
        self.optimizer.zero_grad()
        if self.fabric.device.type == "cuda":
            torch.cuda.synchronize()  # a step's time, not its launch's

    def timed_steps(self, n: int) -> list[float]:
        times = []
        for _ in range(n):
            start = time.perf_counter()
            self.step()
            times.append(time.perf_counter() - start)
        return times

    def round(self, mode: str, root: Path, number: int, before: float, steps: int) -> dict:
        """A step, a save (``none``, ``sync`` or ``async``), ``steps`` steps and the wait."""
        begin = time.perf_counter()
        self.step()
        start = time.perf_counter()
        if mode != "none":  # the loop saves after the step's update
            save_checkpoint(
                self.fabric,
                root / mode,
                number,
                {"model": self.model, "optimizer": self.optimizer},
                keep_last_k=1,
                writes=self.writes if mode == "async" else None,
            )
        end = time.perf_counter()
        slower = sum(t - before for t in self.timed_steps(steps))
        waiting = time.perf_counter()
        self.writes.wait(self.fabric)  # the write ends before the next save (as in the loop)
        done = time.perf_counter()
        return {
            "starts": (end - begin) / before,
            "total": done - begin,
            "call": end - start,
            "wait": done - waiting,
            "slower": slower,
        }


if __name__ == "__main__":
    main()
