"""What the two peer jobs share: the exported job, kiln's schedule, the data, event times.

The peer jobs run in their own environment (torch, transformers, datasets, lightning, wandb,
accelerate; never kiln): everything kiln-specific they need is in the export directory that
``export_kiln_job.py`` wrote (``job.json``, ``model/``, ``train.jsonl``, ``val.jsonl``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path
from typing import Any

EVENTS_ENV = "PEERS_EVENTS"
"""The file each job appends its event times to (JSON lines; bench_peers.py reads them)."""


def job_arguments() -> argparse.Namespace:
    """The command line bench_peers.py gives each peer job: ``EXPORT_DIR OUT_DIR [--logger]``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("export", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--logger", choices=("wandb", "none"), default="wandb")
    return parser.parse_args()


def event(name: str, **extra: Any) -> None:
    """Append ``name`` and the wall clock (``time.time()``) to ``$PEERS_EVENTS``."""
    path = os.environ.get(EVENTS_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"event": name, "t": time.time(), **extra}) + "\n")


def load_job(export: Path) -> dict[str, Any]:
    """The exported hyperparameters (see export_kiln_job.py)."""
    return json.loads((export / "job.json").read_text())


def lr_factor(step: int, job: dict[str, Any]) -> float:
    """kiln's schedule (kiln.models.optim.lr_factor): warm-up to the peak, then linear or
    cosine decay to ``min_lr_ratio``, or constant."""
    warmup, total = job["schedule_warmup_steps"], job["max_steps"]
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if job["schedule"] == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    decay = (
        0.5 * (1 + math.cos(math.pi * progress)) if job["schedule"] == "cosine" else 1 - progress
    )
    return job["min_lr_ratio"] + (1 - job["min_lr_ratio"]) * decay


def optimizer_and_schedule(model: Any, job: dict[str, Any]) -> tuple[Any, Any]:
    """AdamW with kiln's decay groups (the parameter names in ``job["no_decay"]`` get none),
    kiln's implementation (``job["fused"]``: the fused kernel, kiln's and HF ``Trainer``'s
    default; a Lightning user asks for it with ``fused=True``) and kiln's per-step schedule."""
    import torch

    no_decay = set(job["no_decay"])
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in named if n not in no_decay], "weight_decay": job["weight_decay"]},
        {"params": [p for n, p in named if n in no_decay], "weight_decay": 0.0},
    ]
    fused = True if job["fused"] else None  # None: torch's default (the loop on the CPU)
    optimizer = torch.optim.AdamW(
        groups, lr=job["lr"], betas=job["betas"], eps=job["eps"], fused=fused
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, job))
    return optimizer, schedule


def tokenized(export: Path, split: str, job: dict[str, Any], tokenizer: Any) -> Any:
    """``<split>.jsonl`` (text, label; in kiln's order) tokenized as kiln tokenizes it."""
    import datasets

    rows = [json.loads(line) for line in (export / f"{split}.jsonl").read_text().splitlines()]
    data = datasets.Dataset.from_list(rows)

    def encode(batch: dict[str, list]) -> dict[str, list]:
        out = dict(
            tokenizer(
                batch["text"], truncation=True, max_length=job["max_length"], padding="max_length"
            )
        )
        out["labels"] = batch["label"]
        return out

    return data.map(encode, batched=True, remove_columns=data.column_names).with_format("torch")


def metrics(preds: Any, labels: Any) -> dict[str, float]:
    """Accuracy and binary F1, as kiln's validation reports them."""
    import numpy as np

    preds, labels = np.asarray(preds), np.asarray(labels)
    tp = float(((preds == 1) & (labels == 1)).sum())
    predicted, actual = float((preds == 1).sum()), float((labels == 1).sum())
    f1 = 2 * tp / (predicted + actual) if predicted + actual else 0.0
    return {"accuracy": float((preds == labels).mean()), "f1": f1}


def weights_sha256(model: Any, prefix: str = "model.") -> str:
    """kiln.core.weights_hash of kiln's module holding ``model`` (its parameters are named
    ``model.<name>``): equal to the export's ``init_weights_sha256`` when the weights are."""
    import hashlib

    import torch

    digest = hashlib.sha256()
    for key, value in model.state_dict().items():
        digest.update((prefix + key).encode())
        tensor = value.detach().cpu().contiguous()
        digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
        flat = tensor.reshape(-1)
        digest.update(flat.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()
