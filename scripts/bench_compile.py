"""What compiling costs and buys: cold vs warm inductor caches, whole-model vs regional compile.

For each tiny model (built from its config by ``kiln.models.create_model``, one fixed
synthetic batch) it times, in one process:

- ``cold full``: the first compiled training step (forward + backward) of the whole
  ``training_step`` with an empty cache directory, minus the median eager step;
- ``warm full``: the same after ``torch._dynamo.reset()`` (a clean in-memory state, as a new
  job of a sweep has) with the now-filled cache directory (FX graph + AOTAutograd caches);
- ``cold regional``: ``compile.regional=true`` (each repeated block compiled in place) with
  another empty cache directory;

and each variant's step speedup over eager: median of per-pair ratios, eager and compiled
steps interleaved after a warm-up.

    uv run --all-packages python scripts/bench_compile.py [--models bert-tiny-cls ...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
import torch._dynamo.utils as dynamo_utils

from kiln.core import CompileConfig
from kiln.core.loop.compile import compile_scope
from kiln.core.telemetry.compile_watch import cache_figures
from kiln.models import create_model

MODELS = ("bert-tiny-cls", "llama-tiny-lm", "vit-tiny")


def _step(fn: Callable, batch: dict) -> float:
    started = time.perf_counter()
    fn(batch, 0)["loss"].backward()
    return time.perf_counter() - started


def _speedup(eager: Callable, compiled: Callable, batch: dict, pairs: int) -> float:
    for _ in range(3):  # warm-up
        _step(eager, batch), _step(compiled, batch)
    ratios = [_step(eager, batch) / _step(compiled, batch) for _ in range(pairs)]
    return statistics.median(ratios)


def measure(name: str, batch_size: int, pairs: int) -> list[dict]:
    """Rows of (variant, compile seconds, cache state, step speedup) for model ``name``."""
    torch.manual_seed(0)
    module = create_model(name)
    module.train()
    batch = module.example_batch(batch_size)
    eager_s = statistics.median(_step(module.training_step, batch) for _ in range(5))
    rows = []
    with tempfile.TemporaryDirectory() as full_dir, tempfile.TemporaryDirectory() as reg_dir:
        for variant, cache, regional in (
            ("cold full", full_dir, False),
            ("warm full", full_dir, False),
            ("cold regional", reg_dir, True),
        ):
            torch._dynamo.reset()
            dynamo_utils.counters.clear()
            config = CompileConfig(mode="default", cache_dir=cache, regional=regional)
            with compile_scope(module, config):
                fn = module.training_step if regional else torch.compile(module.training_step)
                compile_s = _step(fn, batch) - eager_s
                cache_state = cache_figures(dynamo_utils.counters)["compile_cache"]
                speedup = _speedup(module.training_step, fn, batch, pairs)
            rows.append(dict(model=name, variant=variant, compile_s=compile_s,
                             cache=cache_state, speedup=speedup))  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--pairs", type=int, default=10, help="interleaved eager/compiled pairs")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads={torch.get_num_threads()}, inductor, 32-true")
    print("| model | variant | compile s | cache | step speedup vs eager |")
    print("| --- | --- | ---: | --- | ---: |")
    for name in args.models:
        for row in measure(name, args.batch_size, args.pairs):
            print(
                f"| {row['model']} | {row['variant']} | {row['compile_s']:.1f} | "
                f"{row['cache']} | {row['speedup']:.3f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
