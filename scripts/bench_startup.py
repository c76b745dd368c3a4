"""Start-up cost of kiln's commands, as whole processes, against ``import torch`` alone.

Each variant is a full command (a fresh interpreter, as a user or a SLURM task pays it);
rounds interleave the variants (A B C ..., A B C ...), so drift on a shared machine hits them
alike. Printed per variant: median / min / max wall seconds over the rounds and the median's
ratio to ``import torch``. The breakdown of a job's time before its first step is read off
differences between variants that each add one thing: imports, config composition, a
one-step job (model, data, Fabric setup and the step), W&B's offline run, a second worker,
and what the cut of the interpreter's teardown at exit took from the default job
(``kiln.experiments.jobs.fast_exit``). CPU seconds
(user + system) are printed beside wall seconds: on a busy machine they are the steadier
figure.

    uv run python scripts/bench_startup.py --rounds 5
    uv run python scripts/bench_startup.py --rounds 3 --only help,cfg
"""

from __future__ import annotations

import argparse
import os
import resource
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
    "import kiln.experiments.train.train_job, kiln.core.loop.fit, kiln.models.hf,"
    " kiln.models.vision, wandb"
)


# the default job as it ran before its process ended without the interpreter's teardown
WITH_TEARDOWN = (
    "from kiln.experiments.train.cli import register_configs, run_hydra_app, task; "
    "run_hydra_app(task, 'train', register_configs)"
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
        "default job, 1 step, + teardown": [
            sys.executable,
            "-c",
            WITH_TEARDOWN,
            "trainer.max_steps=1",
            "logger=none",
        ],
    }


def run_once(cmd: list[str], scratch: Path) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system, the process and the children it waited
    for) of one run of ``cmd`` (a job gets a fresh run dir under ``scratch``)."""
    run_dir = Path(tempfile.mkdtemp(dir=scratch))
    job = Path(cmd[0]).name == "kiln-train" or WITH_TEARDOWN in cmd
    if job and "--help" not in cmd and "--cfg" not in cmd:
        cmd = [*cmd, f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=run_dir)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    expected_failure = "trainer.no_such_key=1" in cmd
    if (proc.returncode != 0) != expected_failure:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    shutil.rmtree(run_dir, ignore_errors=True)
    return wall, cpu


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
        cpus: dict[str, list[float]] = {name: [] for name in chosen}
        run_once(chosen["import torch"], scratch)  # warm the page cache first
        for _ in range(args.rounds):
            for name, cmd in chosen.items():
                wall, cpu = run_once(cmd, scratch)
                times[name].append(wall)
                cpus[name].append(cpu)

    base = statistics.median(times["import torch"])
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()})")
    # CPU seconds grow less with other jobs' load than wall seconds: on a busy machine,
    # compare those
    header = f"{'variant':<30} {'median s':>9} {'min':>7} {'max':>7} {'x import torch':>15}"
    print(f"{header} {'median CPU s':>13}")
    for name, values in times.items():
        med = statistics.median(values)
        print(
            f"{name:<30} {med:9.2f} {min(values):7.2f} {max(values):7.2f} {med / base:15.2f}"
            f" {statistics.median(cpus[name]):13.2f}"
        )

    def diff(name: str, minus: str | None) -> str | None:
        if name not in times or (minus is not None and minus not in times):
            return None
        wall, cpu = (
            statistics.median(d[name]) - (statistics.median(d[minus]) if minus else 0.0)
            for d in (times, cpus)
        )
        return f"{wall:6.2f} s  ({cpu:5.2f} CPU s)"

    steps = [
        ("python + torch", "import torch", None),
        ("kiln's job imports", "job imports", "import torch"),
        ("config (compose)", "cfg", "report help"),  # both import no torch
        ("model, data, Fabric, 1 step", "1-step job", "job imports"),
        ("W&B offline run", "1-step job, W&B", "1-step job"),
        ("second worker", "1-step job, 2 workers", "1-step job"),
        ("teardown at exit (cut)", "default job, 1 step, + teardown", "default job, 1 step"),
    ]
    print("\nbreakdown (differences of medians):")
    for label, name, minus in steps:
        if (figure := diff(name, minus)) is not None:
            print(f"  {label:<30} {figure}")


if __name__ == "__main__":
    main()
