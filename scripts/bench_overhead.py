"""How much slower is kiln's loop than a hand-written PyTorch loop? (CPU, fp32, eager)

Trains the same MLP on the same data from the same initial weights four ways: a plain
PyTorch loop (forward, backward, optimizer step), a naive Fabric loop (``fabric.setup``,
``fabric.backward``, step: the seed's loop without accumulation), ``kiln.core.fit`` with
the machine sampler at ``--machine-sample-s``, ``kiln.core.fit`` with it off, and with no
observer at all (``trainer.telemetry=false``); no
accumulation and no shuffling, interleaved (plain fabric kiln kiln-unsampled ... plain ...) so
machine noise hits all alike; kiln/kiln-unsampled is what the sampler costs. Step time is
measured the same way in each: the time between the starts of consecutive
``training_step`` calls (the whole loop iteration: data, forward, backward, optimizer,
bookkeeping), warm-up steps excluded, median per run, then median over runs. Peak memory is
measured in a fresh process per variant: RSS sampled every millisecond during a run, after a
short run that loads everything lazily imported. The final weights of all four must be
bit-identical.

    uv run --all-packages python scripts/bench_overhead.py [--steps 60 --repeats 5 --clock cpu]
        [--machine-sample-s 1.0|none]

The last line is ``overhead_ratio=<kiln/plain> identical=<true|false> vs_fabric=<kiln/fabric>
sampler_ratio=<kiln/kiln-unsampled> unobserved_vs_fabric=<kiln-unobserved/fabric>``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass

import lightning as L
import psutil
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from kiln.core import TrainerConfig, fit
from kiln.experiments.bench.stats import bootstrap_median_interval


@dataclass
class BenchConfig:
    steps: int = 60
    """Optimizer steps per run (one epoch: the data holds exactly this many batches)."""
    warmup: int = 5
    """Steps excluded from each run's step times."""
    batch_size: int = 64
    in_features: int = 256
    width: int = 1024
    classes: int = 10
    lr: float = 0.05
    seed: int = 0
    clock: str = "wall"
    """``wall`` (perf_counter) or ``cpu``: this thread's CPU time, which leaves out the time
    the scheduler gives other processes (on a loaded machine a 1 ms step can read 10 ms)."""
    machine_sample_s: float | None = TrainerConfig.machine_sample_s
    """kiln's machine sampler cadence (``trainer.machine_sample_s``; ``None``: off)."""


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


class MLPModule(L.LightningModule):
    """A three-layer MLP classifier on random data, following kiln's module contract."""

    def __init__(self, cfg: BenchConfig) -> None:
        super().__init__()
        self.cfg = cfg
        torch.manual_seed(cfg.seed)  # same initial weights in every run
        self.net = torch.nn.Sequential(
            torch.nn.Linear(cfg.in_features, cfg.width),
            torch.nn.ReLU(),
            torch.nn.Linear(cfg.width, cfg.width),
            torch.nn.ReLU(),
            torch.nn.Linear(cfg.width, cfg.classes),
        )
        g = torch.Generator().manual_seed(cfg.seed + 1)
        n = cfg.steps * cfg.batch_size
        self.x = torch.randn(n, cfg.in_features, generator=g)
        self.y = torch.randint(0, cfg.classes, (n,), generator=g)
        self.step_starts: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        self.step_starts.append(CLOCKS[self.cfg.clock]())
        x, y = batch
        return {"loss": F.cross_entropy(self(x), y), "num_items": x.shape[0]}

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return {"pred": self(x).argmax(-1), "label": y}

    def validation_metrics(self, outputs):
        return {"accuracy": (outputs["pred"] == outputs["label"]).float().mean().item()}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.cfg.lr, momentum=0.9)

    def train_dataloader(self):
        return DataLoader(
            TensorDataset(self.x, self.y),
            batch_size=self.cfg.batch_size,
            shuffle=False,
            drop_last=True,
        )

    def val_dataloader(self):
        n = 2 * self.cfg.batch_size
        return DataLoader(TensorDataset(self.x[:n], self.y[:n]), batch_size=self.cfg.batch_size)


def train_plain(cfg: BenchConfig) -> MLPModule:
    """The hand-written baseline: what any PyTorch user writes, plus a final validation."""
    module = MLPModule(cfg)
    optimizer = module.configure_optimizers()
    module.train()
    for i, batch in enumerate(module.train_dataloader()):
        if i == cfg.steps:
            break
        loss = module.training_step(batch, i)["loss"]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    module.eval()
    with torch.no_grad():
        outputs = [module.validation_step(b, i) for i, b in enumerate(module.val_dataloader())]
    module.validation_metrics({k: torch.cat([o[k] for o in outputs]) for k in outputs[0]})
    return module


def train_fabric(cfg: BenchConfig) -> MLPModule:
    """The naive Fabric loop a Fabric user writes first: setup, backward, step."""
    module = MLPModule(cfg)
    fabric = L.Fabric(accelerator="cpu", devices=1, precision="32-true")
    model, optimizer = fabric.setup(module, module.configure_optimizers())
    loader = fabric.setup_dataloaders(module.train_dataloader())
    model.train()
    for i, batch in enumerate(loader):
        if i == cfg.steps:
            break
        loss = model.training_step(batch, i)["loss"]
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    with torch.no_grad():
        val = fabric.setup_dataloaders(module.val_dataloader())
        outputs = [model.validation_step(b, i) for i, b in enumerate(val)]
    module.validation_metrics({k: torch.cat([o[k] for o in outputs]) for k in outputs[0]})
    return module


def train_kiln(cfg: BenchConfig, telemetry: bool = True) -> MLPModule:
    """The same training through ``kiln.core.fit`` with its defaults (no progress output)
    and the machine sampled every ``cfg.machine_sample_s`` seconds; ``telemetry=False``:
    with no observer at all (``trainer.telemetry=false``)."""
    module = MLPModule(cfg)
    trainer = TrainerConfig(
        max_steps=cfg.steps,
        accelerator="cpu",
        devices=1,
        precision="32-true",
        seed=cfg.seed,
        warmup_steps=cfg.warmup,
        progress=False,
        machine_sample_s=cfg.machine_sample_s,
        telemetry=telemetry,
    )
    fit(module, trainer=trainer)
    return module


def train_kiln_unsampled(cfg: BenchConfig) -> MLPModule:
    """``train_kiln`` with the machine sampler off."""
    return train_kiln(BenchConfig(**{**asdict(cfg), "machine_sample_s": None}))


def train_kiln_unobserved(cfg: BenchConfig) -> MLPModule:
    """``train_kiln`` with observation off: no step timer, sampler or memory figures."""
    return train_kiln(cfg, telemetry=False)


VARIANTS = {
    "plain": train_plain,
    "fabric": train_fabric,
    "kiln": train_kiln,
    "kiln-unsampled": train_kiln_unsampled,
    "kiln-unobserved": train_kiln_unobserved,
}


def step_time(module: MLPModule, warmup: int) -> float:
    """Median interval between consecutive training_step starts after ``warmup`` steps."""
    starts = module.step_starts
    intervals = [b - a for a, b in zip(starts[warmup:], starts[warmup + 1 :], strict=False)]
    if not intervals:
        raise ValueError(f"{len(starts)} steps leave no interval after {warmup} warm-up steps")
    return statistics.median(intervals)


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _paired(times: dict[str, list[float]], a: str, b: str) -> tuple[list[float], list[float]]:
    """Per-round ratios a/b and differences a - b (each round ran every variant once)."""
    pairs = list(zip(times[a], times[b], strict=True))
    return [x / y for x, y in pairs], [x - y for x, y in pairs]


def compare(cfg: BenchConfig, repeats: int) -> dict:
    """Run every variant ``repeats`` times, interleaved; time them, compare weights.

    Returns:
        ``<variant>_step_s`` (median over runs of each run's median step time),
        ``ratio`` (median of the per-round ratios kiln/plain), ``ratio_min``/``ratio_max``,
        ``ratio_ci``/``vs_fabric_ci`` (bootstrap 95% intervals of those medians),
        ``overhead_s`` (median of the per-round differences kiln - plain), ``vs_fabric``
        (median of kiln/fabric), ``fabric_ratio`` (fabric/plain), ``fabric_overhead_s``
        (fabric - plain), ``sampler_ratio`` (median of kiln/kiln-unsampled) with
        ``sampler_ratio_ci``, the per-run figures, and ``identical`` (every run of every variant
        ended with bit-identical weights).
    """
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    wall: dict[str, list[float]] = {name: [] for name in VARIANTS}
    reference: MLPModule | None = None
    identical = True
    for _ in range(repeats):
        for name, train in VARIANTS.items():
            started = time.perf_counter()
            module = train(cfg)
            wall[name].append(time.perf_counter() - started)
            times[name].append(step_time(module, cfg.warmup))
            if reference is None:
                reference = module
            else:
                identical &= same_weights(reference, module)
    ratios, diffs = _paired(times, "kiln", "plain")
    vs_fabric, _ = _paired(times, "kiln", "fabric")
    fabric_ratios, fabric_diffs = _paired(times, "fabric", "plain")
    sampler, _ = _paired(times, "kiln", "kiln-unsampled")
    unobserved, _ = _paired(times, "kiln-unobserved", "fabric")
    result = {
        "ratio": statistics.median(ratios),
        "overhead_s": statistics.median(diffs),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratio_ci": bootstrap_median_interval(ratios),
        "vs_fabric": statistics.median(vs_fabric),
        "vs_fabric_ci": bootstrap_median_interval(vs_fabric),
        "fabric_ratio": statistics.median(fabric_ratios),
        "fabric_overhead_s": statistics.median(fabric_diffs),
        "sampler_ratio": statistics.median(sampler),
        "sampler_ratio_ci": bootstrap_median_interval(sampler),
        "unobserved_vs_fabric": statistics.median(unobserved),
        "unobserved_vs_fabric_ci": bootstrap_median_interval(unobserved),
        "identical": identical,
    }
    for name in VARIANTS:
        result[f"{name}_step_s"] = statistics.median(times[name])
        result[f"{name}_runs_s"] = times[name]
        result[f"{name}_wall_s"] = statistics.median(wall[name])
    return result


def _rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def peak_memory(cfg: BenchConfig, variant: str) -> dict:
    """Peak RSS of one run of ``variant`` in a fresh process (memory is per process)."""
    config = json.dumps(asdict(cfg))
    command = [sys.executable, __file__, "--memory-of", variant, "--config", config]
    command += ["--threads", str(torch.get_num_threads())]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _measure_memory_here(cfg: BenchConfig, variant: str) -> None:
    # the process's lifetime peak (ru_maxrss) may come from importing libraries, so the
    # training's own peak is sampled while it runs (timing is not measured in this process)
    VARIANTS[variant](BenchConfig(**{**asdict(cfg), "steps": cfg.warmup + 2}))  # lazy imports
    baseline = _rss_mb()
    peak = baseline
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _rss_mb())
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    VARIANTS[variant](cfg)
    done.set()
    sampler.join()
    peak = max(peak, _rss_mb())
    print(json.dumps({"peak_rss_mb": peak, "training_mb": peak - baseline}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=BenchConfig.steps)
    parser.add_argument("--warmup", type=int, default=BenchConfig.warmup)
    parser.add_argument("--width", type=int, default=BenchConfig.width)
    parser.add_argument("--batch-size", type=int, default=BenchConfig.batch_size)
    parser.add_argument("--repeats", type=int, default=5, help="runs of each variant")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="step time as wall time or as this thread's CPU time (robust to a loaded machine)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (1: on a shared machine, threads that wait for each other at "
        "every op turn preemption into stalls of tens of milliseconds)",
    )
    parser.add_argument(
        "--machine-sample-s",
        type=lambda v: None if v == "none" else float(v),
        default=BenchConfig.machine_sample_s,
        help="kiln's machine sampler cadence in seconds, or none (its cost: compare the ratios)",
    )
    parser.add_argument("--memory-of", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_of:
        torch.set_num_threads(args.threads)
        _measure_memory_here(BenchConfig(**json.loads(args.config)), args.memory_of)
        return
    cfg = BenchConfig(
        steps=args.steps,
        warmup=args.warmup,
        width=args.width,
        batch_size=args.batch_size,
        clock=args.clock,
        machine_sample_s=args.machine_sample_s,
    )
    if cfg.steps < cfg.warmup + 2:
        parser.error(f"--steps={cfg.steps} must exceed --warmup={cfg.warmup} by at least 2")
    torch.set_num_threads(args.threads)

    print(f"config: {asdict(cfg)}, repeats={args.repeats}, torch threads={torch.get_num_threads()}")
    for train in VARIANTS.values():  # warm up the process: allocator, kernels, lazy imports
        train(cfg)
    result = compare(cfg, args.repeats)
    memory = {name: peak_memory(cfg, name) for name in VARIANTS}
    for name in VARIANTS:
        runs = ", ".join(f"{t * 1e3:.2f}" for t in result[f"{name}_runs_s"])
        print(
            f"{name:>14}: median step {result[f'{name}_step_s'] * 1e3:.3f} ms (runs: {runs}); "
            f"whole run {result[f'{name}_wall_s']:.3f} s; peak RSS "
            f"{memory[name]['peak_rss_mb']:.1f} MiB "
            f"(+{memory[name]['training_mb']:.1f} during training)"
        )
    overhead_us = result["overhead_s"] * 1e6
    low, high = result["ratio_ci"]
    print(
        f"kiln/plain step time: {result['ratio']:.4f} (95% CI {low:.4f}-{high:.4f}; "
        f"per-round range {result['ratio_min']:.4f}-{result['ratio_max']:.4f}); "
        f"{overhead_us:+.0f} us per step"
    )
    print(
        f"fabric/plain step time: {result['fabric_ratio']:.4f}; "
        f"{result['fabric_overhead_s'] * 1e6:+.0f} us per step"
    )
    low, high = result["vs_fabric_ci"]
    print(f"kiln/fabric step time: {result['vs_fabric']:.4f} (95% CI {low:.4f}-{high:.4f})")
    low, high = result["sampler_ratio_ci"]
    print(
        f"kiln/kiln-unsampled step time (sampler every {cfg.machine_sample_s} s vs off): "
        f"{result['sampler_ratio']:.4f} (95% CI {low:.4f}-{high:.4f})"
    )
    low, high = result["unobserved_vs_fabric_ci"]
    print(
        f"kiln-unobserved/fabric step time (trainer.telemetry=false): "
        f"{result['unobserved_vs_fabric']:.4f} (95% CI {low:.4f}-{high:.4f})"
    )
    print(f"final weights bit-identical: {result['identical']}")
    print(
        f"overhead_ratio={result['ratio']:.4f} identical={str(result['identical']).lower()} "
        f"vs_fabric={result['vs_fabric']:.4f} sampler_ratio={result['sampler_ratio']:.4f} "
        f"unobserved_vs_fabric={result['unobserved_vs_fabric']:.4f}"
    )


if __name__ == "__main__":
    main()
