"""Feed ``kiln-train`` inputs a user gets wrong, one process each, and say how each ended.

Every case must end in one of two ways: **refused** (exit 1, ``summary.json`` says
``failed`` with a one-line error naming the key or file, and no W&B run when the refusal
comes in the config or setup stage) or **warned** (the run goes on and a warning names the
key). Anything else is a defect: **silent** (the run went on and nothing named the input),
**traceback** (a Python traceback on the terminal) or **destroyed record**. The cases aimed
at a finished job (a re-run it refuses, ``kiln-eval``/``kiln-export`` pointed into it) run
on a copy of one trained job, and must leave every byte of it as it was (the lock's holder
line aside). Prints one row per case and a count; exits 1 when any case is a defect.

    uv run --all-packages python scripts/bad_inputs.py [--only SUBSTRING] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

FAST = ["debug=fast", "compile.backend=aot_eager", "trainer.max_steps=2"]
LM = ["model=llama-tiny-lm", "data=lm_text", "data.num_train=64", "data.num_val=16"]
LRS_100 = ",".join([f"{1e-4 * (i + 1):.4g}" for i in range(99)] + ["-1"])  # one bad of 100
STREAM = ["model=llama-tiny-lm", "data=lm_corpus", "data.packing=true", "data.streaming=true"]


@dataclass
class Case:
    name: str
    args: list[str]
    names: str  # what the refusal or warning must say
    expect: str = "refused"  # or "warned"
    sweep: bool = False  # a -m sweep (refused whole before any job, or by job 0's record)
    on_job: str | None = None  # run against a copy of a finished job: train, eval or export
    remove: str | None = None  # what to delete from that copy first


CASES = [
    # typed configs in every group (issue 40, section 2)
    Case("packing=no", [*LM, "data.packing=no"], "data.packing='no'"),
    Case("packing='false'", [*LM, "data.packing='false'"], "data.packing='false'"),
    Case("packing=yes", [*LM, "data.packing=yes"], "data.packing='yes'"),
    Case("shuffle_buffer=abc", [*LM, "data.shuffle_buffer=abc"], "data.shuffle_buffer='abc'"),
    Case("batch_size=0", ["data.batch_size=0"], "batch_size=0 must be >= 1"),
    Case("batch_size=abc", ["data.batch_size=abc"], "data.batch_size"),
    Case("buckets=[a]", ["data.buckets=[a]"], "data.buckets"),
    Case("ema.decay=abc", ["callbacks=ema", "callbacks.ema.decay=abc"], "callbacks.ema.decay"),
    Case(
        "ema.validate_with_ema=no",
        ["callbacks=ema", "callbacks.ema.validate_with_ema=no"],
        "callbacks.ema.validate_with_ema",
    ),
    Case("model.tiny=yes", ["model=bert-tiny-cls", "model.tiny=yes"], "model.tiny='yes'"),
    Case("img_size=abc", ["model=resnet-tiny", "data=digits", "model.img_size=abc"], "img_size"),
    Case("max_steps=-1", ["trainer.max_steps=-1"], "trainer.max_steps"),
    Case("max_steps=abc", ["trainer.max_steps=abc"], "trainer.max_steps"),
    Case("precision=fp8", ["trainer.precision=fp8"], "fp8"),
    Case("accumulate=0", ["trainer.accumulate_grad_batches=0"], "accumulate_grad_batches"),
    Case("devices=0", ["trainer.devices=0"], "trainer.devices"),
    Case("clip=-1", ["trainer.gradient_clip_norm=-1"], "gradient_clip_norm"),
    Case("log_every=0", ["trainer.log_every_n_steps=0"], "log_every_n_steps"),
    Case("val_every=0", ["trainer.val_every_n_steps=0"], "val_every_n_steps"),
    Case("warmup=-1", ["trainer.warmup_steps=-1"], "warmup_steps"),
    Case("lr=abc", ["optimizer.lr=abc"], "optimizer.lr"),
    Case("compile.mode=fast", ["compile.mode=fast"], "compile.mode"),
    Case("model=nowhere", ["model=nowhere"], "model/nowhere"),
    Case("optimizer=nowhere", ["optimizer=nowhere"], "optimizer/nowhere"),
    Case("unknown key", ["trainer.max_stesp=3"], "max_stesp"),
    # model and data that do not fit together (section 3)
    Case("lm model, text data", ["model=llama-tiny-lm"], "data="),
    Case("vit on text", ["model=vit-tiny"], "data="),
    # resources and limits (section 4)
    Case("shuffle_buffer=1e8", [*STREAM, "data.shuffle_buffer=100000000"], "data.shuffle_buffer"),
    Case("threads_per_rank=64", ["trainer.threads_per_rank=64"], "threads_per_rank", "warned"),
    Case("warmup>=max_steps", ["trainer.warmup_steps=100"], "warmup_steps", "warned"),
    Case("streaming+max_epochs", [*STREAM, "trainer.max_epochs=1"], "max_epochs"),
    Case(
        "packing+flash_attention_2",
        [*LM, "data.packing=true", "model.attn_implementation=flash_attention_2"],
        "flash_attention_2",
    ),
    Case("profile too short", ["profile=steps"], "profile", "warned"),
    # files and directories
    Case("missing shards", [*STREAM, "paths.corpus_dir=/nowhere"], "does not exist"),
    Case("resume from nowhere", ["trainer.resume=/nowhere/step-1.ckpt"], "/nowhere"),
    Case("checkpoint_dir unwritable", ["trainer.checkpoint_dir=/proc/kiln"], "checkpoint_dir"),
    Case("missing csv", ["data.dataset=csv", "data.data_files=/nowhere.csv"], "/nowhere.csv"),
    # a finished job's record is its own (issue 44): refused, and not a byte of it changed
    Case("rerun: fewer steps", ["trainer.max_steps=1"], "below the step", on_job="train"),
    Case("rerun: other lr", ["optimizer.lr=0.5"], "optimizer.lr", on_job="train"),
    Case("rerun: other model", ["model=resnet-tiny", "data=digits"], "model", on_job="train"),
    Case(
        "eval --out J/summary.json",
        ["{job}", "--out", "{job}/summary.json"],
        "--out",
        on_job="eval",
    ),
    Case("export J J", ["{job}", "{job}"], "out_dir", on_job="export"),
    Case("export J J/sub", ["{job}", "{job}/exported"], "out_dir", on_job="export"),
    Case(
        "eval a copy without checkpoints",
        ["{job}"],
        "checkpoints",
        on_job="eval",
        remove="checkpoints",
    ),
    # the launcher (section 5)
    Case(
        "preempt_requeue=maybe",
        ["launcher=slurm", "trainer.accelerator=cpu", "hydra.launcher.preempt_requeue=maybe"],
        "hydra.launcher.preempt_requeue='maybe'",
        sweep=True,
    ),
    # a sweep is checked whole before its first job starts (issue 46, item 1): refused naming
    # the bad job, with no job trained
    Case("sweep: lr=1e-3,-1", ["optimizer.lr=1e-3,-1"], "job #1 optimizer.lr=-1", sweep=True),
    Case(
        "sweep: packing=false,no",
        [*LM, "data.packing=false,no"],
        "job #1 data.packing=no",
        sweep=True,
    ),
    Case("sweep: 100 jobs, #99 bad", [f"optimizer.lr={LRS_100}"], "job #99", sweep=True),
]


def _bytes(job: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(job)): p.read_bytes()
        for p in sorted(job.rglob("*"))
        if p.is_file() and p.name != "job.lock"
    }


def train_base(root: Path) -> Path:
    """The finished job the ``on_job`` cases copy (2 steps, its W&B run offline)."""
    base = root / "base-job"
    cmd = [sys.executable, "-m", "kiln.experiments.train", *FAST, f"hydra.run.dir={base}"]
    env = {**os.environ, "WANDB_MODE": "offline", "KILN_LOG_DIR": str(root)}
    subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root, timeout=900, check=True)
    return base


def run_on_job(case: Case, root: Path, base: Path) -> tuple[str, str]:
    """A case aimed at a copy of the finished job: refused, naming what, every byte kept."""
    import shutil

    job = root / "".join(c if c.isalnum() else "_" for c in case.name)
    shutil.copytree(base, job, symlinks=True)
    if case.remove:
        shutil.rmtree(job / case.remove)
    before = _bytes(job)
    args = [a.replace("{job}", str(job)) for a in case.args]
    if case.on_job == "train":
        args = [*FAST, *args, f"hydra.run.dir={job}"]
    cmd = [sys.executable, "-m", f"kiln.experiments.{case.on_job}", *args]
    env = {**os.environ, "WANDB_MODE": "offline", "KILN_LOG_DIR": str(root)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root, timeout=900)
    output = proc.stdout + proc.stderr
    if "Traceback (most recent call last)" in output:
        return "traceback", output.split("Traceback")[-1].strip().splitlines()[-1][:150]
    if _bytes(job) != before:
        changed = sorted(k for k in {*before, *_bytes(job)} if before.get(k) != _bytes(job).get(k))
        return "destroyed record", f"exit {proc.returncode}; changed: {changed[:4]}"
    if proc.returncode == 0:
        return "silent", f"exit 0; nothing names {case.names!r}"
    said = [line for line in output.splitlines() if case.names in line]
    if not said:
        return "unnamed", (output.strip().splitlines() or ["(no output)"])[-1][:150]
    return "refused", said[0].strip()[:150]


def run(case: Case, root: Path) -> tuple[str, str]:
    """Run one case; return its outcome and the line that shows it."""
    job = root / "".join(c if c.isalnum() else "_" for c in case.name)
    where = f"hydra.sweep.dir={job}" if case.sweep else f"hydra.run.dir={job}"
    cmd = [sys.executable, "-m", "kiln.experiments.train", *(["-m"] if case.sweep else [])]
    cmd += [*FAST, *case.args, where]
    env = {**os.environ, "WANDB_MODE": "offline", "KILN_LOG_DIR": str(job)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root, timeout=900)
    output = proc.stdout + proc.stderr
    if "Traceback (most recent call last)" in output:
        return "traceback", output.split("Traceback")[-1].strip().splitlines()[-1][:150]
    record = _record(job / ("0" if case.sweep else ""))
    if proc.returncode == 0:
        warned = [line for line in output.splitlines() if case.names in line]
        if case.expect == "warned" and warned:
            return "warned", warned[0].strip()[:150]
        return "silent", f"exit 0; nothing names {case.names!r}"
    error = (record or {}).get("error") or _hydra_error(proc.stderr)
    if case.names not in (error if record else proc.stderr):  # Hydra's: several lines
        return "unnamed", error[:150]
    if record is not None:
        lost = record.get("status") != "failed" or "\n" in (record.get("error") or "")
        early = record.get("error_stage") in ("config", "setup")
        if lost or (early and (job / "wandb").exists()):
            return "bad record", f"{record.get('status')} {record.get('error_stage')}: {error}"[
                :150
            ]
    if record is None:  # refused before any job (Hydra, or kiln's check of the whole sweep)
        error = next((line for line in proc.stderr.splitlines() if case.names in line), error)
    return "refused", error.strip().splitlines()[0][:150]


def _hydra_error(stderr: str) -> str:
    """The message of an error Hydra printed (refused before kiln's job began), one line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(("Set the environment", "See https"))]
    return " ".join(lines[:2]) if lines else "(no message)"


def _record(job: Path) -> dict | None:
    try:
        return json.loads((job / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="run the cases whose name holds this")
    parser.add_argument("--jobs", type=int, default=2, help="cases run at once")
    args = parser.parse_args()
    cases = [c for c in CASES if args.only is None or args.only in c.name]
    with tempfile.TemporaryDirectory(prefix="kiln-bad-inputs-") as tmp:
        root = Path(tmp)
        base = train_base(root) if any(c.on_job for c in cases) else root

        def one(case: Case) -> tuple[str, str]:
            return run_on_job(case, root, base) if case.on_job else run(case, root)

        with ThreadPoolExecutor(args.jobs) as pool:
            outcomes = list(pool.map(one, cases))
    defects = 0
    for case, (outcome, line) in zip(cases, outcomes, strict=True):
        good = outcome == case.expect
        defects += not good
        print(f"{'ok ' if good else 'BAD'} {case.name:<28} {outcome:<10} {line}")
    print(f"{len(cases)} bad inputs: {len(cases) - defects} {'/'.join({c.expect for c in cases})} "
          f"as expected, {defects} not")  # fmt: skip
    sys.exit(1 if defects else 0)


if __name__ == "__main__":
    main()
