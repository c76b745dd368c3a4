"""Train a timm model from scratch on scikit-learn's digits (8x8, upscaled), on the CPU.

python -m kiln.models.examples.timm_digits [--model resnet-digits] [--max-steps 100]
"""

from __future__ import annotations

import argparse

from kiln.models.examples.common import run, trainer_arguments


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    trainer_arguments(parser, steps=100, lr=2e-3)
    parser.add_argument("--model", default="resnet-digits", help="an image-classification model")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--weight-decay", type=float, default=0.05)
    args = parser.parse_args(argv)

    from kiln.models import OptimizerConfig, SchedulerConfig, create_model
    from kiln.models.data import ImageClassificationData

    data = ImageClassificationData(
        batch_size=args.batch_size, val_batch_size=120, num_workers=args.num_workers, seed=args.seed
    )
    module = create_model(
        args.model,
        data=data,
        optimizer=OptimizerConfig(lr=args.lr, weight_decay=args.weight_decay),
        scheduler=SchedulerConfig(name="cosine", warmup_ratio=args.warmup_ratio),
    )
    return run(module, args, f"{args.model} on digits (1437 train / 360 validation images)")


if __name__ == "__main__":
    main()
