"""kiln's default job written for the Lightning ``Trainer``, as a user would write it.

    python lightning_trainer_job.py EXPORT_DIR OUT_DIR [--logger wandb|none]

Same work as kiln's job (``export_kiln_job.py`` wrote it down): the starting weights, the
training rows in kiln's order (no shuffling), AdamW with kiln's decay groups and per-step
schedule, clipping, batch size, ``32-true``, validation and checkpoints every
``val_every_n_steps`` / ``checkpoint_every_n_steps`` (no sanity-check validation: kiln runs
none), logging every ``log_every_n_steps``. Runs in the peers' environment, without kiln.
Event times go to ``$PEERS_EVENTS``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_common import (
    event,
    job_arguments,
    load_job,
    metrics,
    optimizer_and_schedule,
    tokenized,
    weights_sha256,
)


def main() -> None:
    args = job_arguments()

    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    job = load_job(args.export)
    L.seed_everything(job["seed"])

    class Classifier(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = AutoModelForSequenceClassification.from_pretrained(args.export / "model")
            self.model.train()  # from_pretrained returns it in eval mode; the Trainer keeps modes
            self.outputs: list[tuple[torch.Tensor, torch.Tensor]] = []

        def training_step(self, batch, batch_idx):
            loss = self.model(**batch).loss
            self.log("train/loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            out = self.model(**batch)
            self.log("val/loss", out.loss)
            self.outputs.append((out.logits.argmax(-1), batch["labels"]))

        def on_validation_epoch_end(self):
            preds = torch.cat([p for p, _ in self.outputs]).numpy()
            labels = torch.cat([y for _, y in self.outputs]).numpy()
            self.outputs.clear()
            self.log_dict({f"val/{k}": v for k, v in metrics(preds, labels).items()})

        def configure_optimizers(self):
            optimizer, schedule = optimizer_and_schedule(self.model, job)
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": schedule, "interval": "step"},
            }

    class Events(L.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            event("step_start", step=trainer.global_step + 1)

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            event("step_end", step=trainer.global_step)

        def on_validation_start(self, trainer, module):
            event("validation_start")

        def on_validation_end(self, trainer, module):
            event("validation_end")

        def on_train_end(self, trainer, module):
            event("fit_end")

    module = Classifier()
    event("weights", sha256=weights_sha256(module.model))
    tokenizer = AutoTokenizer.from_pretrained(args.export / "model")
    train = torch.utils.data.DataLoader(
        tokenized(args.export, "train", job, tokenizer), batch_size=job["batch_size"]
    )
    val = torch.utils.data.DataLoader(
        tokenized(args.export, "val", job, tokenizer), batch_size=job["val_batch_size"]
    )
    callbacks: list = [Events()]
    if job["checkpoints"]:
        callbacks.append(
            ModelCheckpoint(
                dirpath=args.out / "checkpoints",
                every_n_train_steps=job["checkpoint_every_n_steps"],
                save_top_k=-1,
            )
        )
    if args.logger == "wandb":
        from lightning.pytorch.loggers import WandbLogger

        logger = WandbLogger(name="lightning-trainer", save_dir=str(args.out), offline=True)
    else:
        logger = False
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        precision=job["precision"],
        max_steps=job["max_steps"],
        accumulate_grad_batches=job["accumulate_grad_batches"],
        gradient_clip_val=job["gradient_clip_norm"],
        val_check_interval=job["val_every_n_steps"],
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        log_every_n_steps=job["log_every_n_steps"],
        logger=logger,
        enable_checkpointing=job["checkpoints"],
        callbacks=callbacks,
        default_root_dir=str(args.out),
    )
    trainer.fit(module, train, val)
    loss = trainer.callback_metrics.get("train/loss")
    print(f"lightning-trainer: step {trainer.global_step} train_loss {float(loss):.4f}")


if __name__ == "__main__":
    main()
