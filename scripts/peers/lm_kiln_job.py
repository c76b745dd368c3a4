"""The causal-LM benchmark's kiln jobs: kiln's ``fit`` on the pieces ``bench_peers_lm.py``
prepared, as ``lm_peer_job.py`` trains them (one epoch, AdamW fused without weight decay,
constant learning rate, no clipping, on ``job.json``'s accelerator and precision).

    python lm_kiln_job.py WORK_DIR OUT_DIR VARIANT

- ``kiln-padded``: one piece a row, padded to ``max_length`` (kiln's fixed shapes).
- ``kiln-packed``: the pieces packed into rows of ``max_length`` (``pack_documents``, policy
  ``whole``: no piece is split again, so the same tokens are counted).
- ``kiln-packed-compile``: the same, under ``torch.compile`` (inductor, default mode).
- ``kiln-packed-graphs``: the same, compile mode ``reduce-overhead`` (CUDA graphs).

Training batches keep kiln's fixed shape (``drop_last``): a short last batch is dropped, which
the benchmark's common token budget (the fewest any variant trained) never reaches.
Writes ``OUT_DIR/model`` and ``OUT_DIR/result.json`` as ``lm_peer_job.py`` does, plus kiln's
own telemetry.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, cast

VARIANTS = ("kiln-padded", "kiln-packed", "kiln-packed-compile", "kiln-packed-graphs")
COMPILE_MODES = {"kiln-packed-compile": "default", "kiln-packed-graphs": "reduce-overhead"}


def padded_rows(pieces: list[list[int]], length: int, pad_id: int) -> list[dict[str, Any]]:
    import torch

    rows = []
    for piece in pieces:
        ids = torch.full((length,), pad_id, dtype=torch.long)
        ids[: len(piece)] = torch.tensor(piece)
        mask = (torch.arange(length) < len(piece)).long()
        rows.append(
            {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}
        )
    return rows


def packed_rows(
    pieces: list[list[int]], length: int, pad_id: int, seed: int
) -> list[dict[str, Any]]:
    import torch

    from kiln.models.data.packing import pack_documents

    arrays, _ = pack_documents(pieces, length, pad_id, policy="whole", seed=seed)
    tensors = {k: torch.from_numpy(v) for k, v in arrays.items()}
    return [{k: v[i] for k, v in tensors.items()} for i in range(len(tensors["input_ids"]))]


class Trace:
    """(seconds since the first step began, real tokens so far) after every step: kiln's
    hooks, called once per micro-batch (no accumulation: once per step)."""

    def __init__(self, cuda: bool) -> None:
        self.start: float | None = None
        self.points: list[list[float]] = []
        self.cuda = cuda  # a step has ended when its kernels have, not when they were queued

    def on_fit_start(self) -> None:
        self.start = time.perf_counter()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        assert self.start is not None
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        done = self.points[-1][1] if self.points else 0
        tokens = int((batch["labels"][:, 1:] != -100).sum())
        self.points.append([time.perf_counter() - self.start, done + tokens])


def main() -> None:
    work, out, variant = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    if variant not in VARIANTS:
        raise SystemExit(f"variant {variant!r} is not valid; choose one of: {', '.join(VARIANTS)}")
    from torch.utils.data import DataLoader, default_collate

    from kiln.core import CompileConfig, TrainerConfig, fit
    from kiln.models.hf import HFCausalLM
    from kiln.models.optim import OptimizerConfig, SchedulerConfig

    job = json.loads((work / "job.json").read_text())
    pieces = json.loads((work / "pieces.json").read_text())["train"]
    length, pad_id = job["max_length"], job["pad_id"]
    if variant == "kiln-padded":
        rows = padded_rows(pieces, length, pad_id)
    else:
        rows = packed_rows(pieces, length, pad_id, job["seed"])
    module = HFCausalLM(
        pretrained=str(work / "model"),
        optimizer=OptimizerConfig(lr=job["lr"], weight_decay=0.0),
        scheduler=SchedulerConfig(name="constant"),
    )
    batch = job["rows_per_batch"]
    module.train_dataloader = lambda: DataLoader(
        cast(Any, rows), batch_size=batch, shuffle=True, drop_last=True, collate_fn=default_collate
    )
    module.val_dataloader = lambda: None  # pyright: ignore[reportAttributeAccessIssue]
    steps = len(rows) // batch
    accelerator = job.get("accelerator", "cpu")
    trainer = TrainerConfig(
        accelerator=accelerator, precision=job.get("precision", "32-true"), max_steps=steps,
        seed=job["seed"], log_every_n_steps=steps, progress=False, checkpoint_dir=None,
    )  # fmt: skip
    mode = COMPILE_MODES.get(variant)
    compiled = CompileConfig(mode=mode) if mode else None
    trace = Trace(cuda=accelerator == "cuda")
    result = fit(module, trainer, compiled, callbacks=[trace])
    out.mkdir(parents=True, exist_ok=True)
    module.model.save_pretrained(out / "model")
    telemetry = {k: v for k, v in result.telemetry.items() if isinstance(v, int | float | str)}
    (out / "result.json").write_text(json.dumps({"trace": trace.points, "telemetry": telemetry}))


if __name__ == "__main__":
    main()
