"""Golden runs: seven float64 ``kiln-train`` jobs whose final weights and histories must not
move when the loop's code is reorganised.

    python scripts/golden_runs.py record outputs/golden      # writes outputs/golden/golden.json
    python scripts/golden_runs.py compare outputs/golden     # reruns; exit 1 on any difference

Each job runs in a fresh interpreter, as a user runs it. What is compared: every logged
training row (loss, lr, grad norm) and validation row, bit for bit, and a SHA-256 of each
tensor of the final checkpoint (read with torch's own DCP reader, not kiln's).
The jobs: plain; accumulation with a partial last window; DDP on 2 ranks; FSDP2 on 2 ranks;
a packed causal LM; a streaming packed LM SIGKILLed after its first checkpoint and resumed;
a compiled job (``aot_eager``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BASE = [
    "debug=fast",
    "precision=64-true",
    "trainer.deterministic=true",
    "trainer.max_steps=6",
    "trainer.val_every_n_steps=3",
    "trainer.checkpoint_every_n_steps=2",
    "logger=csv",
]
# the packing policy of 05087a5's default, pinned: the golden numbers are its
LM = ["model=llama-tiny-lm", "data=lm_text", "data.num_train=96", "data.num_val=16"]
LM += ["data.packing_policy=carry"]
JOBS: dict[str, list[str]] = {
    "plain": ["data.num_train=64", "data.num_val=16"],
    # 40 samples in batches of 8: 5 a epoch, windows of 2: the third window is partial
    "accumulation_partial": [
        "data.num_train=40",
        "data.num_val=16",
        "trainer.accumulate_grad_batches=2",
    ],
    "ddp_2_ranks": ["trainer=ddp_cpu", "data.num_train=64", "data.num_val=16"],
    "fsdp_2_ranks": ["trainer=fsdp_cpu", "data.num_train=64", "data.num_val=16"],
    "packed_lm": [*LM, "data.packing=true", "data.max_length=64"],
    "compiled_aot_eager": [
        "data.num_train=64",
        "data.num_val=16",
        "compile=default",
        "compile.backend=aot_eager",
    ],
}
STREAM = [
    "model=llama-tiny-lm",
    "data=lm_corpus",
    "data.packing=true",
    "data.streaming=true",
    "data.packing_policy=carry",
    "data.max_length=64",
    "data.batch_size=2",
    "data.shuffle_buffer=8",
    "data.max_val_samples=2",
    "trainer.max_steps=16",
    "trainer.checkpoint_every_n_steps=4",
    "trainer.accumulate_grad_batches=2",
]


def _env(log_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return env | {
        "WANDB_MODE": "offline",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "KILN_LOG_DIR": str(log_dir),
    }


def _train(args: list[str], job_dir: Path, log_dir: Path, wait: bool = True) -> Any:
    cmd = [sys.executable, "-m", "kiln.experiments.train", *args, f"hydra.run.dir={job_dir}"]
    out = (log_dir / f"{job_dir.name}.log").open("a")
    proc = subprocess.Popen(cmd, env=_env(log_dir), cwd=log_dir, stdout=out, stderr=out)
    if not wait:
        return proc
    if proc.wait(timeout=900) != 0:
        raise SystemExit(f"{job_dir.name} failed: see {out.name}")
    return proc


def _streaming(job_dir: Path, log_dir: Path, corpus: Path) -> None:
    args = [*BASE, *STREAM, f"paths.corpus_dir={corpus}"]
    proc = _train(args, job_dir, log_dir, wait=False)
    run_file = job_dir / "checkpoints" / "run.json"
    while proc.poll() is None:  # SIGKILL once the first checkpoint is in place
        try:
            if json.loads(run_file.read_text())["checkpoints"]:
                proc.send_signal(signal.SIGKILL)
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.02)
    proc.wait()
    _train(args, job_dir, log_dir)
    attempts = json.loads((job_dir / "summary.json").read_text())["attempts"]
    if len(attempts) < 2 or not attempts[-1].get("from_step"):
        raise SystemExit(f"the streaming job did not resume: {attempts}")


def _digest(job_dir: Path) -> dict[str, Any]:
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    record = json.loads((job_dir / "summary.json").read_text())
    newest = sorted((job_dir / "checkpoints").glob("step-*.ckpt"))[-1]
    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(newest, Path(tmp) / "flat.pt")
        state = torch.load(Path(tmp) / "flat.pt", weights_only=False)
    weights = {
        key: hashlib.sha256(value.detach().contiguous().cpu().numpy().tobytes()).hexdigest()
        for key, value in sorted(state["model"].items())
    }
    return {
        "checkpoint": newest.name,
        "history": record["history"],
        "validation_history": record.get("validation_history"),
        "metrics": record.get("metrics"),
        "weights": weights,
    }


def run_all(out: Path) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "tests" / "experiments"))
    from train_helpers import write_tiny_corpus  # pyright: ignore[reportMissingImports]

    out.mkdir(parents=True, exist_ok=True)
    corpus = out / "corpus"
    if not corpus.exists():
        write_tiny_corpus(corpus)
    digests = {}
    for name, args in JOBS.items():
        started = time.perf_counter()
        _train([*BASE, *args], out / name, out)
        digests[name] = _digest(out / name)
        print(f"{name}: {time.perf_counter() - started:.0f} s", flush=True)
    started = time.perf_counter()
    _streaming(out / "streaming_killed_resumed", out, corpus)
    digests["streaming_killed_resumed"] = _digest(out / "streaming_killed_resumed")
    print(f"streaming_killed_resumed: {time.perf_counter() - started:.0f} s", flush=True)
    return digests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["record", "compare"])
    parser.add_argument("dir", type=Path)
    args = parser.parse_args()
    golden = args.dir / "golden.json"
    if args.action == "record":
        golden.write_text(json.dumps(run_all(args.dir / "record"), indent=1, sort_keys=True))
        print(f"recorded {golden}")
        return 0
    want = json.loads(golden.read_text())
    got = run_all(Path(tempfile.mkdtemp(prefix="golden-")))
    differ = 0
    for name, expected in want.items():
        same = got.get(name) == expected
        differ += not same
        print(f"{name}: {'bit-identical' if same else 'DIFFERS'}")
        if not same:
            for key in expected:
                if got.get(name, {}).get(key) != expected[key]:
                    print(f"  {key} differs")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
