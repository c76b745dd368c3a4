"""Fine-tune the packaged MiniLM on kiln's generated sentiment data, on the CPU.

python -m kiln.models.examples.minilm_sentiment [--max-steps 60] [--batch-size 16]
"""

from __future__ import annotations

import argparse

from kiln.models.examples.common import run, trainer_arguments


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    trainer_arguments(parser, steps=60, lr=1e-4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=24, help="generated rows: <= 21 tokens")
    parser.add_argument("--num-train", type=int, default=4000)
    parser.add_argument("--num-val", type=int, default=1000)
    args = parser.parse_args(argv)

    from kiln.models import OptimizerConfig, SchedulerConfig, create_model
    from kiln.models.data import TextClassificationData

    data = TextClassificationData(
        num_train=args.num_train,
        num_val=args.num_val,
        max_length=args.max_length,
        batch_size=args.batch_size,
        val_batch_size=100,
        num_workers=args.num_workers,
        seed=args.seed,
    )
    module = create_model(
        "minilm-cls",
        data=data,
        optimizer=OptimizerConfig(lr=args.lr),
        scheduler=SchedulerConfig(name="linear", warmup_ratio=args.warmup_ratio),
    )
    return run(module, args, "minilm-cls on kiln/sentiment (generated, with negation/contrast)")


if __name__ == "__main__":
    main()
