"""Start-up cost of kiln's commands, as whole processes, against ``import torch`` alone.

Each variant is a full command (a fresh interpreter, as a user or a SLURM task pays it);
rounds interleave the variants (A B C ..., A B C ...), so drift on a shared machine hits them
alike. Printed per variant: median / min / max wall seconds over the rounds and the median's
ratio to ``import torch``. The breakdown of a job's time before its first step is read off
differences between variants that each add one thing: imports, config composition, a
one-step job (model, data, Fabric setup and the step), W&B's offline run.

    uv run python scripts/bench_startup.py --rounds 5
    uv run python scripts/bench_startup.py --rounds 3 --only help,cfg
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
JOB = ["model=bert-tiny-cls", "debug=fast", "compile=none", "trainer.max_steps=1"]
# kiln.core's loop, the HF and timm wrappers, W&B: what a training job imports
JOB_IMPORTS = (
    "import kiln.experiments.train.runner, kiln.core.loop, kiln.models.hf, kiln.models.vision,"
    " wandb"
)


def variants(out: Path) -> dict[str, list[str]]:
    """Name -> command. ``{out}`` job dirs are fresh per run (see :func:`run_once`)."""
    train = str(BIN / "kiln-train")
    return {
        "import torch": [sys.executable, "-c", "import torch"],
        "help": [train, "--help"],
        "cfg": [train, "--cfg", "job"],
        "config error": [train, "trainer.no_such_key=1"],
        "report help": [str(BIN / "kiln-report"), "--help"],
        "bench help": [str(BIN / "kiln-bench"), "--help"],
        "job imports": [sys.executable, "-c", JOB_IMPORTS],
        "1-step job": [train, *JOB, "logger=none"],
        "1-step job, W&B": [train, *JOB, "logger=wandb"],
        "1-step job, 2 workers": [
            train,
            *JOB,
            "logger=none",
            "trainer.devices=2",
            "trainer.accelerator=cpu",
        ],
        "default job, 1 step": [train, "trainer.max_steps=1", "logger=none"],
    }


def run_once(cmd: list[str], scratch: Path) -> float:
    """Wall seconds of one run of ``cmd`` (a job gets a fresh run dir under ``scratch``)."""
    run_dir = Path(tempfile.mkdtemp(dir=scratch))
    if Path(cmd[0]).name == "kiln-train" and "--help" not in cmd and "--cfg" not in cmd:
        cmd = [*cmd, f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=run_dir)
    wall = time.perf_counter() - start
    expected_failure = "trainer.no_such_key=1" in cmd
    if (proc.returncode != 0) != expected_failure:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    shutil.rmtree(run_dir, ignore_errors=True)
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved runs per variant")
    parser.add_argument("--only", default="", help="comma-separated variant names (substrings)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="kiln-startup-") as tmp:
        scratch = Path(tmp)
        chosen = variants(scratch)
        if args.only:
            keep = [s.strip() for s in args.only.split(",")]
            chosen = {
                k: v for k, v in chosen.items() if k == "import torch" or any(s in k for s in keep)
            }
        times: dict[str, list[float]] = {name: [] for name in chosen}
        run_once(chosen["import torch"], scratch)  # warm the page cache first
        for _ in range(args.rounds):
            for name, cmd in chosen.items():
                times[name].append(run_once(cmd, scratch))

    base = statistics.median(times["import torch"])
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()})")
    print(f"{'variant':<24} {'median s':>9} {'min':>7} {'max':>7} {'x import torch':>15}")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:<24} {med:9.2f} {min(values):7.2f} {max(values):7.2f} {med / base:15.2f}")

    def med(name: str) -> float | None:
        return statistics.median(times[name]) if name in times else None

    steps = [
        ("python + torch", med("import torch"), 0.0),
        ("kiln's job imports", med("job imports"), med("import torch")),
        ("config (compose)", med("cfg"), med("report help")),  # both import no torch
        ("model, data, Fabric, 1 step", med("1-step job"), med("job imports")),
        ("W&B offline run", med("1-step job, W&B"), med("1-step job")),
        ("second worker", med("1-step job, 2 workers"), med("1-step job")),
    ]
    print("\nbreakdown of the tiny 1-step job (differences of medians):")
    for label, value, minus in steps:
        if value is not None and minus is not None:
            print(f"  {label:<30} {value - minus:6.2f} s")


if __name__ == "__main__":
    main()
