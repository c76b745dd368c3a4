"""kiln's default job written for HF ``transformers.Trainer``, as a user would write it.

    python hf_trainer_job.py EXPORT_DIR OUT_DIR [--logger wandb|none]

Same work as kiln's job (``export_kiln_job.py`` wrote it down): the starting weights, the
training rows in kiln's order (a sequential sampler over them), AdamW with kiln's decay
groups and schedule, clipping, batch size, fp32, evaluation and checkpoints every
``val_every_n_steps`` / ``checkpoint_every_n_steps``, logging every ``log_every_n_steps``.
Runs in the peers' environment, without kiln. Event times go to ``$PEERS_EVENTS``.
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

    import torch
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        Trainer,
        TrainerCallback,
        TrainingArguments,
        default_data_collator,
    )

    job = load_job(args.export)
    model = AutoModelForSequenceClassification.from_pretrained(args.export / "model")
    event("weights", sha256=weights_sha256(model))
    tokenizer = AutoTokenizer.from_pretrained(args.export / "model")
    train_set = tokenized(args.export, "train", job, tokenizer)
    val_set = tokenized(args.export, "val", job, tokenizer)

    class Events(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            event("step_start", step=state.global_step + 1)

        def on_step_end(self, args, state, control, **kwargs):
            event("step_end", step=state.global_step)

        def on_train_end(self, args, state, control, **kwargs):
            event("fit_end")

    class InOrderTrainer(Trainer):
        def _get_train_sampler(self, train_dataset=None):
            # the rows are already in kiln's order, one step after another
            return torch.utils.data.SequentialSampler(train_dataset or self.train_dataset)

        def evaluate(self, *a, **kw):
            event("validation_start")
            try:
                return super().evaluate(*a, **kw)
            finally:
                event("validation_end")

    def compute_metrics(prediction):
        return metrics(prediction.predictions.argmax(-1), prediction.label_ids)

    optimizer, schedule = optimizer_and_schedule(model, job)
    checkpoints = "steps" if job["checkpoints"] else "no"
    training_args = TrainingArguments(
        output_dir=str(args.out),
        max_steps=job["max_steps"],
        per_device_train_batch_size=job["batch_size"],
        per_device_eval_batch_size=job["val_batch_size"],
        gradient_accumulation_steps=job["accumulate_grad_batches"],
        max_grad_norm=job["gradient_clip_norm"],
        eval_strategy="steps",
        eval_steps=job["val_every_n_steps"],
        save_strategy=checkpoints,
        save_steps=job["checkpoint_every_n_steps"],
        logging_steps=job["log_every_n_steps"],
        seed=job["seed"],
        use_cpu=True,
        report_to=["wandb"] if args.logger == "wandb" else "none",
        run_name="hf-trainer",
    )
    trainer = InOrderTrainer(
        model=model,
        args=training_args,
        train_dataset=train_set,
        eval_dataset=val_set,
        data_collator=default_data_collator,
        compute_metrics=compute_metrics,
        optimizers=(optimizer, schedule),
        callbacks=[Events()],
    )
    result = trainer.train()
    print(f"hf-trainer: step {trainer.state.global_step} train_loss {result.training_loss:.4f}")


if __name__ == "__main__":
    main()
