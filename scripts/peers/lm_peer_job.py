"""The causal-LM benchmark's peer jobs, written as a user of each trainer would write them.

    python lm_peer_job.py WORK_DIR OUT_DIR VARIANT

``WORK_DIR`` is what ``bench_peers_lm.py`` prepared (``job.json``, ``pieces.json``: the
training pieces as token ids, ``model/``: the starting weights). Each variant trains one
epoch over the same pieces with AdamW (fused, no weight decay, constant learning rate, no
clipping), on ``job.json``'s accelerator and precision, then saves its weights to
``OUT_DIR/model`` and
``OUT_DIR/result.json``: ``trace``, after every optimizer step the seconds since the first
step began and the real tokens (labels the loss counts) trained so far.

- ``hf``: ``transformers.Trainer`` with dynamic padding (``DataCollatorForSeq2Seq``: pads
  each batch to its longest piece, labels -100 on padding) and
  ``train_sampling_strategy="group_by_length"``.
- ``hf-flat``: ``transformers.Trainer`` with its padding-free ``DataCollatorWithFlattening``
  (each batch one row of the pieces back to back, positions restarting per piece; the SDPA
  mask is then block-diagonal, from the positions).
- ``lightning``: ``lightning.Trainer`` with the same model in a ``LightningModule``, dynamic
  padding, shuffled batches.

Runs in the peers' environment (never kiln's).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, cast

VARIANTS = ("hf", "hf-flat", "lightning")


def rows(pieces: list[list[int]]) -> list[Any]:
    return [{"input_ids": p, "labels": list(p)} for p in pieces]


def real_tokens(labels: Any) -> int:
    """Labels the loss counts: not -100, after the shift (a row's first token has none)."""
    return int((labels[:, 1:] != -100).sum())


class Trace:
    """(seconds since the first step began, real tokens so far) after every step."""

    def __init__(self, cuda: bool) -> None:
        self.start: float | None = None
        self.points: list[list[float]] = []
        self.cuda = cuda  # a step has ended when its kernels have, not when they were queued

    def begin(self) -> None:
        if self.start is None:
            self.start = time.perf_counter()

    def end(self, tokens: int) -> None:
        assert self.start is not None
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        done = self.points[-1][1] if self.points else 0
        self.points.append([time.perf_counter() - self.start, done + tokens])


def pad_collate(pad_id: int) -> Any:
    """Pad a batch to its longest piece; labels -100 on padding (never by token id: the
    corpus's pad token is its end-of-text token, which is a real token)."""
    import torch

    def collate(batch: list[dict[str, list[int]]]) -> dict[str, Any]:
        longest = max(len(b["input_ids"]) for b in batch)
        ids = torch.full((len(batch), longest), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for i, b in enumerate(batch):
            ids[i, : len(b["input_ids"])] = torch.tensor(b["input_ids"])
            mask[i, : len(b["input_ids"])] = 1
        return {
            "input_ids": ids,
            "attention_mask": mask,
            "labels": ids.masked_fill(mask == 0, -100),
        }

    return collate


def train_hf(variant: str, work: Path, out: Path, job: dict[str, Any], pieces: Any) -> list:
    from datasets import Dataset
    from transformers import (
        AutoModelForCausalLM,
        DataCollatorWithFlattening,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    model = AutoModelForCausalLM.from_pretrained(work / "model", attn_implementation="sdpa")
    flat = variant == "hf-flat"
    trace, collated = Trace(cuda=job.get("accelerator") == "cuda"), []
    # batches are collated in training order, but the loader may run one ahead of the steps
    inner = DataCollatorWithFlattening() if flat else pad_collate(job["pad_id"])

    def collator(batch: Any) -> Any:
        out = inner(batch)
        collated.append(real_tokens(out["labels"]))
        return out

    class Times(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            trace.begin()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            trace.end(collated[len(trace.points)])

    arguments = TrainingArguments(
        output_dir=str(out / "trainer"),
        per_device_train_batch_size=job["rows_per_batch"] if not flat else job["pieces_per_batch"],
        num_train_epochs=1,
        learning_rate=job["lr"],
        weight_decay=0.0,
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        optim="adamw_torch_fused",
        train_sampling_strategy="random" if flat else "group_by_length",
        use_cpu=job.get("accelerator", "cpu") == "cpu",
        bf16=job.get("precision") == "bf16-mixed",
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=job["seed"],
    )
    trainer = Trainer(
        model=model,
        args=arguments,
        train_dataset=Dataset.from_list(rows(pieces)),
        data_collator=collator,
        callbacks=[Times()],
    )
    trainer.train()
    model.save_pretrained(out / "model")
    return trace.points


def train_lightning(work: Path, out: Path, job: dict[str, Any], pieces: Any) -> list:
    import lightning as L
    import torch
    from torch.utils.data import DataLoader
    from transformers import AutoModelForCausalLM

    trace = Trace(cuda=job.get("accelerator") == "cuda")

    class LM(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = AutoModelForCausalLM.from_pretrained(
                work / "model", attn_implementation="sdpa"
            )
            self.model.train()  # from_pretrained returns eval mode; the Trainer keeps a mode

        def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
            return self.model(**batch).loss

        def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
            trace.begin()

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            trace.end(real_tokens(batch["labels"]))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=job["lr"], weight_decay=0.0, fused=True)

    L.seed_everything(job["seed"], verbose=False)
    module = LM()
    loader = DataLoader(
        cast(Any, rows(pieces)),
        batch_size=job["rows_per_batch"],
        shuffle=True,
        collate_fn=pad_collate(job["pad_id"]),
    )
    trainer = L.Trainer(
        accelerator=job.get("accelerator", "cpu"),
        precision=job.get("precision", "32-true"),
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, loader)
    module.model.save_pretrained(out / "model")
    return trace.points


def main() -> None:
    work, out, variant = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    if variant not in VARIANTS:
        raise SystemExit(f"variant {variant!r} is not valid; choose one of: {', '.join(VARIANTS)}")
    job = json.loads((work / "job.json").read_text())
    pieces = json.loads((work / "pieces.json").read_text())["train"]
    out.mkdir(parents=True, exist_ok=True)
    if variant == "lightning":
        points = train_lightning(work, out, job, pieces)
    else:
        points = train_hf(variant, work, out, job, pieces)
    (out / "result.json").write_text(json.dumps({"trace": points}))


if __name__ == "__main__":
    main()
