"""Export kiln's default job for the peer jobs: its starting weights, its data in its order,
and its hyperparameters. Runs in kiln's environment (bench_peers.py calls it).

    python scripts/peers/export_kiln_job.py OUT_DIR [kiln-train overrides ...]

Writes ``OUT_DIR/model`` (``save_pretrained`` of the module kiln's job builds, seeded as the
job seeds it, with its tokenizer), ``train.jsonl`` (the rows of every training step, in the
order kiln's loop draws them), ``val.jsonl`` and ``job.json``. Checks that re-tokenizing the
exported rows gives kiln's own batches.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf


def main(out: Path, overrides: list[str]) -> None:
    import torch
    from lightning.fabric import Fabric

    from kiln.core import weights_hash
    from kiln.core.loop.data import epoch_batches, training_loader
    from kiln.experiments.settings.compose import config_dir
    from kiln.experiments.train.preflight import build_checked
    from kiln.experiments.train.train_config import register_configs, validate
    from kiln.models.optim import parameter_groups

    register_configs()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        # the output dir only feeds checkpoint_dir, which the export does not use
        cfg = compose("train", overrides=[*overrides, f"paths.output_dir={out}"])
    resolved = OmegaConf.to_container(cfg, resolve=True)
    trainer, data_cfg = resolved["trainer"], resolved["data"]
    module = build_checked(validate(cfg))  # seeded and built exactly as kiln-train's job does
    init_hash = weights_hash(module)
    module.export(out / "model")
    data = module.data_module
    train_raw, val_raw = data.raw()

    # kiln's training order: its own sampler, epoch after epoch, one row list per step
    fabric = Fabric(accelerator="cpu", devices=1)
    loader = training_loader(module.train_dataloader(), fabric, trainer["seed"])
    steps, rows, epoch = trainer["max_steps"], [], 0
    while len(rows) < steps:
        loader.batch_sampler.start(epoch)
        rows.extend(list(loader.batch_sampler)[: steps - len(rows)])
        epoch += 1
    first = next(epoch_batches(fabric, loader, trainer["seed"], 0))
    encoded = data.tokenizer(
        [train_raw[i][data.text_column] for i in rows[0]],
        truncation=True,
        max_length=data.max_length,
        padding="max_length",
        return_tensors="pt",
    )
    if not torch.equal(encoded["input_ids"], first["input_ids"]):
        raise SystemExit("the exported rows do not re-tokenize to kiln's first batch")

    def line(row: dict) -> str:
        return json.dumps({"text": row[data.text_column], "label": int(row[data.label_column])})

    (out / "train.jsonl").write_text(
        "".join(line(train_raw[i]) + "\n" for batch in rows for i in batch)
    )
    limit = trainer["limit_val_batches"]  # kiln validates on the first batches only
    val_rows = (
        val_raw
        if limit is None
        else val_raw.select(range(min(len(val_raw), limit * data.val_batch_size)))
    )
    (out / "val.jsonl").write_text("".join(line(row) + "\n" for row in val_rows))
    opt, sched = resolved["optimizer"], module.scheduler_config
    named = {id(p): n for n, p in module.named_parameters()}
    no_decay = [named[id(p)] for p in parameter_groups(module, opt["weight_decay"])[1]["params"]]
    job = {
        "init_weights_sha256": init_hash,
        "num_labels": module.num_labels,
        "batch_size": data.batch_size,
        "val_batch_size": data.val_batch_size,
        "max_length": data.max_length,
        "max_steps": steps,
        "accumulate_grad_batches": trainer["accumulate_grad_batches"],
        "gradient_clip_norm": trainer["gradient_clip_norm"],
        "precision": trainer["precision"],
        "seed": trainer["seed"],
        "val_every_n_steps": min(trainer["val_every_n_steps"] or steps, steps),
        "checkpoint_every_n_steps": min(trainer["checkpoint_every_n_steps"] or steps, steps),
        "checkpoints": trainer["checkpoint_dir"] is not None,
        "log_every_n_steps": trainer["log_every_n_steps"],
        "timer_warmup_steps": trainer["warmup_steps"],
        "lr": opt["lr"],
        "betas": list(opt["betas"]),
        "eps": opt["eps"],
        "weight_decay": opt["weight_decay"],
        "fused": opt["fused"],
        "schedule": sched.name,
        "schedule_warmup_steps": sched.warmup(steps),
        "min_lr_ratio": sched.min_lr_ratio,
        # kiln's module names parameters model.<HF name>; the peers hold the HF model itself
        "no_decay": [n.removeprefix("model.") for n in no_decay],
        "data": {k: data_cfg[k] for k in ("num_train", "num_val", "seed")},
    }
    (out / "job.json").write_text(json.dumps(job, indent=1))
    print(json.dumps({"init_weights_sha256": init_hash, "train_rows": len(rows) * len(rows[0])}))


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve(), sys.argv[2:])
