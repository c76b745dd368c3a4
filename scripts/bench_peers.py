"""kiln's default job against HF ``transformers.Trainer`` and the Lightning ``Trainer``.

The same work in three whole processes: the default job (``make train``: the packaged
MiniLM on kiln's generated text, ``--steps`` optimizer steps), and the peer jobs in
``scripts/peers/``, which read what kiln's job would train on (its starting weights, its
training rows in its order, its hyperparameters: ``export_kiln_job.py``). The peers run in
an environment of their own (``--env-dir``, built once with ``uv``: torch, transformers,
datasets, lightning, wandb at the versions kiln's ``uv.lock`` pins, plus accelerate, which
HF ``Trainer`` needs and kiln does not), never kiln's.

Runs interleave (kiln, HF, Lightning; the next round starts one later), and each process's
own events give: whole-process wall time, start-up (spawn to the first step), median step
time (after kiln's ``trainer.warmup_steps``), validation time (all validations), and the
time after training (the last step's validation and checkpoint done, to exit), and the
process tree's CPU seconds (user + system; steadier than wall time on a busy machine). Printed:
medians over runs, the ratios kiln/HF and kiln/Lightning of the medians, and for wall and CPU
time the paired bootstrap 95% interval of that ratio (a round's runs drawn together) with
whether kiln is faster, slower, or neither beyond the run-to-run spread.

    uv run python scripts/bench_peers.py --runs 3
    uv run python scripts/bench_peers.py --steps 3 --runs 1 --logger none   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEERS = ROOT / "scripts" / "peers"
BIN = Path(sys.executable).parent
PEER_PACKAGES = ("torch", "transformers", "datasets", "lightning", "wandb", "accelerate")
VARIANTS = ("kiln", "hf", "lightning")
WARM = "import torch, transformers, lightning, datasets, wandb"
FIGURES = ("wall_s", "cpu_s", "startup_s", "step_s", "validation_s", "after_training_s")


def uv() -> list[str]:
    """The ``uv`` command (on PATH, else ``python -m uv``)."""
    found = shutil.which("uv")
    return [found] if found else [sys.executable, "-m", "uv"]


def peer_env(env_dir: Path) -> Path:
    """The peers' interpreter: a ``uv venv`` under ``env_dir``, built once per set of pins.

    The versions kiln's ``uv.lock`` resolves are the constraints (``uv export``), so torch,
    transformers and lightning are the ones kiln trains with.
    """
    pins = subprocess.run(
        [*uv(), "export", "--frozen", "--all-packages", "--no-hashes", "--no-emit-workspace",
         "--no-dev", "--no-annotate", "--no-header", "--project", str(ROOT)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    venv, stamp = env_dir / "venv", env_dir / "constraints.txt"
    python = venv / "bin" / "python"
    if python.exists() and stamp.exists() and stamp.read_text() == pins:
        return python
    shutil.rmtree(venv, ignore_errors=True)
    env_dir.mkdir(parents=True, exist_ok=True)
    (env_dir / "pending.txt").write_text(pins)
    subprocess.run([*uv(), "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    subprocess.run(
        [*uv(), "pip", "install", "-q", "--compile-bytecode", "--python", str(python),
         "-c", str(env_dir / "pending.txt"), *PEER_PACKAGES],
        check=True,
    )  # fmt: skip
    (env_dir / "pending.txt").rename(stamp)
    return python


def versions(python: Path | str) -> dict[str, str]:
    """The peer packages' versions under ``python``."""
    code = (
        "import importlib.metadata as m, json; "
        f"print(json.dumps({{p: m.version(p) for p in {PEER_PACKAGES!r} if _has(p)}}))"
    )
    code = "def _has(p):\n import importlib.util as u; return u.find_spec(p) is not None\n" + code
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def job_env(events: Path, run_dir: Path) -> dict[str, str]:
    """A user's offline shell, plus where the job writes its event times."""
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    env.update(
        WANDB_MODE="offline", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false", WANDB_DIR=str(run_dir), PEERS_EVENTS=str(events),
    )  # fmt: skip
    return env


def command(variant: str, args: argparse.Namespace, python: Path, run_dir: Path) -> list[str]:
    """The whole process of ``variant``, writing into ``run_dir``."""
    if variant == "kiln":
        cmd = [str(BIN / "kiln-train"), *kiln_overrides(args), f"hydra.run.dir={run_dir}"]
        return [
            *cmd,
            f"logger={args.logger}",
            "+callbacks.peers_events._target_=kiln_events.Events",
        ]
    script = PEERS / f"{'hf' if variant == 'hf' else 'lightning'}_trainer_job.py"
    return [
        str(python),
        str(script),
        str(args.export),
        str(run_dir / "out"),
        "--logger",
        args.logger,
    ]


def kiln_overrides(args: argparse.Namespace) -> list[str]:
    """The default job's overrides: the steps, no checkpoints with ``--no-checkpoints``, and
    ``--override``'s."""
    off = ["trainer.checkpoint_dir=null"] if args.no_checkpoints else []
    return [f"trainer.max_steps={args.steps}", *off, *args.override]


def run_once(variant: str, args: argparse.Namespace, python: Path, scratch: Path) -> dict:
    """One whole process of ``variant`` and its figures (see the module docstring)."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"{variant}-", dir=scratch))
    events_file = run_dir / "events.jsonl"
    env = job_env(events_file, run_dir)
    if variant == "kiln":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PEERS), env.get("PYTHONPATH")]))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    proc = subprocess.run(
        command(variant, args, python, run_dir), capture_output=True, text=True, env=env,
        cwd=run_dir,
    )  # fmt: skip
    wall = time.time() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{variant} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    times = {e["event"]: e["t"] for e in reversed(events)}  # the first of each name
    last = {e["event"]: e["t"] for e in events}
    vals = [e["t"] for e in events if e["event"] == "validation_start"]
    val_ends = [e["t"] for e in events if e["event"] == "validation_end"]
    first_step = times.get("fit_start", times.get("step_start"))
    if variant == "kiln":
        summary = json.loads((run_dir / "summary.json").read_text())
        step, loss = summary["telemetry"]["step_time_median_s"], summary["train_loss"]
        weights = summary["init_weights_sha256"]
    else:
        starts = {e["step"]: e["t"] for e in events if e["event"] == "step_start"}
        ends = {e["step"]: e["t"] for e in events if e["event"] == "step_end"}
        skip = args.job["timer_warmup_steps"]
        skip = skip if len(ends) > skip else 0  # a run no longer than kiln's warm-up: all
        steps = [ends[s] - starts[s] for s in starts if s > skip and s in ends]
        step = statistics.median(steps) if steps else None
        said = [ln for ln in proc.stdout.splitlines() if ln.startswith(f"{variant}-trainer:")]
        loss = said[-1].split()[-1] if said else None
        weights = next(e["sha256"] for e in events if e["event"] == "weights")
    if weights != args.job["init_weights_sha256"]:
        raise RuntimeError(f"{variant} did not start from kiln's weights ({weights})")
    if len(vals) != len(val_ends) or not vals:
        raise RuntimeError(f"{variant}: {len(vals)} validations started, {len(val_ends)} ended")
    if not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    return {
        "wall_s": wall,
        # user + system seconds of the process and the children it waited for: steadier
        # than wall seconds on a shared machine
        "cpu_s": after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime,
        "startup_s": first_step - start,
        "step_s": step,
        "validation_s": sum(e - s for s, e in zip(vals, val_ends, strict=True)),
        "validations": len(vals),
        "after_training_s": start + wall - last["fit_end"],
        "train_loss": float(loss) if loss is not None else None,
    }


def verdict(results: dict[str, list[dict]], peer: str, figure: str) -> str:
    """kiln's ``figure`` over ``peer``'s (median over median) with the paired bootstrap 95%
    interval (round ``i``'s runs drawn together: they shared the machine's moment), and
    whether kiln is faster, slower, or neither beyond the run-to-run spread."""
    from kiln.experiments.bench.stats import bootstrap_speedup_interval

    kiln, other = ([r[figure] for r in results[v]] for v in ("kiln", peer))
    ratio = statistics.median(kiln) / statistics.median(other)
    low, high = bootstrap_speedup_interval(kiln, other)  # median(kiln) / median(peer)
    if len(kiln) < 2:
        said = "one round: no interval"
    else:
        said = "kiln faster" if high < 1 else "kiln slower" if low > 1 else "within the spread"
    name = figure.removesuffix("_s")
    return f"kiln / {peer} {name} {ratio:.3f}x, 95% interval {low:.3f}-{high:.3f}: {said}"


def report(results: dict[str, list[dict]], load: tuple[float, float], info: dict) -> str:
    """The table of medians (min-max) and the ratios to the peers."""
    lines = [
        f"peers' versions: {info['versions']}",
        f"load average (1 min) at the start {load[0]:.2f}, at the end {load[1]:.2f} "
        f"(cores: {os.cpu_count()}); steps {info['steps']}, runs {info['runs']}, "
        f"logger {info['logger']}, checkpoints {'off' if info['no_checkpoints'] else 'on'}, "
        f"overrides {info['overrides']}",
        f"{'median s (min-max)':<18}" + "".join(f"{f.removesuffix('_s'):>24}" for f in FIGURES),
    ]

    def med(variant: str, figure: str) -> float | None:
        values = [r[figure] for r in results[variant] if r[figure] is not None]
        return statistics.median(values) if values else None

    for variant, runs in results.items():
        cells = []
        for figure in FIGURES:
            values = [r[figure] for r in runs if r[figure] is not None]
            cells.append(
                f"{statistics.median(values):.3f} ({min(values):.2f}-{max(values):.2f})"
                if values else "n/a"
            )  # fmt: skip
        lines.append(f"{variant:<18}" + "".join(f"{c:>24}" for c in cells))
    for peer in (v for v in ("hf", "lightning") if v in results and "kiln" in results):
        ratios = []
        for figure in FIGURES:
            a, b = med("kiln", figure), med(peer, figure)
            ratios.append(f"{a / b:.2f}x" if a is not None and b else "n/a")
        lines.append(f"{'kiln / ' + peer:<18}" + "".join(f"{r:>24}" for r in ratios))
    for peer in (v for v in ("hf", "lightning") if v in results and "kiln" in results):
        lines += [verdict(results, peer, figure) for figure in ("wall_s", "cpu_s")]
    losses = {v: [r["train_loss"] for r in runs] for v, runs in results.items()}
    lines.append(f"final train loss per run (same work, different dropout draws): {losses}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="interleaved runs per variant")
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps (default job: 100)")
    parser.add_argument(
        "--logger", choices=("wandb", "none"), default="wandb",
        help="wandb (offline, the default job's) or none, for all three",
    )  # fmt: skip
    parser.add_argument("--no-checkpoints", action="store_true", help="all three without them")
    parser.add_argument(
        "--override", action="append", default=[],
        help="a kiln-train override for the job all three run (repeatable), e.g. +model.tiny=true",
    )  # fmt: skip
    parser.add_argument("--only", default=",".join(VARIANTS), help="comma-separated variants")
    parser.add_argument(
        "--env-dir", type=Path, default=Path.home() / ".cache" / "kiln-bench-peers",
        help="where the peers' environment is built (once)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write the runs' figures here")
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    args = parser.parse_args()
    chosen = [v.strip() for v in args.only.split(",") if v.strip()]
    if bad := [v for v in chosen if v not in VARIANTS]:
        parser.error(f"--only: unknown variant(s) {bad}; choose from {', '.join(VARIANTS)}")
    if args.runs < 1 or args.steps < 1:
        parser.error("--runs and --steps must be >= 1")

    python = peer_env(args.env_dir)
    load_start = os.getloadavg()[0]
    scratch = Path(tempfile.mkdtemp(prefix="kiln-peers-"))
    try:
        args.export = scratch / "export"
        exported = subprocess.run(
            [sys.executable, str(PEERS / "export_kiln_job.py"), str(args.export),
             *kiln_overrides(args)],
            capture_output=True, text=True, env=job_env(scratch / "export-events", scratch),
        )  # fmt: skip
        if exported.returncode != 0:
            raise SystemExit(f"exporting kiln's job failed:\n{exported.stderr[-3000:]}")
        args.job = json.loads((args.export / "job.json").read_text())
        for interpreter in (sys.executable, python):  # warm the page cache first
            subprocess.run([str(interpreter), "-c", WARM], check=True, capture_output=True)
        results: dict[str, list[dict]] = {v: [] for v in chosen}
        for round_ in range(args.runs):
            order = chosen[round_ % len(chosen) :] + chosen[: round_ % len(chosen)]
            for variant in order:
                results[variant].append(run_once(variant, args, python, scratch))
                print(f"round {round_ + 1} {variant}: {results[variant][-1]}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    info = {
        "versions": versions(python),
        "steps": args.steps,
        "runs": args.runs,
        "logger": args.logger,
        "no_checkpoints": args.no_checkpoints,
        "overrides": args.override,
    }
    print(report(results, (load_start, os.getloadavg()[0]), info))
    if args.json:
        args.json.write_text(json.dumps({**info, "results": results}, indent=1))


if __name__ == "__main__":
    main()
