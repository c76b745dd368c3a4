"""Image classification data: scikit-learn's ``digits`` offline, or any HF image dataset.

Transforms come from the model's timm data config (input size, interpolation, mean and
std), so the data matches what the model takes: ``digits``' 8x8 grayscale images are
upscaled to the model's input size and replicated to its channels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch

from kiln.core.optional import require
from kiln.models.contract import ImageModel
from kiln.models.contract import require as require_members
from kiln.models.data.base import DataModule, default_cache_dir
from kiln.models.data.sources import check_columns, load_raw, num_classes

DIGITS = "digits"


def load_digits(val_fraction: float, seed: int, cache_dir: str | Path | None = None):
    """scikit-learn's 1797 8x8 digit images as a (train, validation) pair, split by class."""
    root = Path(cache_dir or default_cache_dir()) / f"digits-v1-{val_fraction}-{seed}"
    if not (root / "dataset_dict.json").exists():
        raw = require("sklearn.datasets", "kiln-models[examples]").load_digits()
        # 0..16 grey levels -> 0..255 bytes, so PIL and timm's transforms take them as-is.
        images = [np.clip(img * 16, 0, 255).astype(np.uint8) for img in raw.images]
        labels = datasets.ClassLabel(names=[str(d) for d in range(10)])
        features = datasets.Features({"image": datasets.Image(), "label": labels})
        rows = {"image": images, "label": raw.target.tolist()}
        full = datasets.Dataset.from_dict(rows, features)
        split = full.train_test_split(test_size=val_fraction, seed=seed, stratify_by_column="label")
        splits = datasets.DatasetDict(train=split["train"], validation=split["test"])
        splits.save_to_disk(str(root))
    data = datasets.load_from_disk(str(root))
    return data["train"], data["validation"]


class ImageClassificationData(DataModule):
    """Image classification data with timm transforms.

    Args:
        dataset: ``digits`` (scikit-learn, offline) or anything ``load_raw`` takes
            (a hub name, or ``imagefolder``-style builders with ``data_files``).
        image_column: The image column (PIL images or arrays).
        label_column: The integer / ``ClassLabel`` label column.
        img_size: Resize images to this size; ``None`` uses the model's input size. A size
            the model cannot take fails when the data is attached, before training.
        augment: Random resized crops (no flips: digits are not symmetric) in training.
        val_fraction: Held-out fraction when the data has no validation split.
        test_fraction: Fraction of the training split held out, stratified by label and
            seeded, as a test split (``test_dataloader``; ``kiln-train test_after_fit=true``,
            ``kiln-eval --split test``). 0 (the default): no test split.
        **kwargs: See ``DataModule`` (batch sizes, workers, seed) and ``load_raw``.
    """

    def __init__(
        self,
        dataset: str = DIGITS,
        image_column: str = "image",
        label_column: str = "label",
        img_size: int | None = None,
        augment: bool = False,
        val_fraction: float = 0.2,
        test_fraction: float = 0.0,
        subset: str | None = None,
        data_files: str | list | dict | None = None,
        train_split: str = "train",
        val_split: str | None = "validation",
        cache_dir: str | None = None,
        batch_size: int = 64,
        val_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
        allow_changed: bool = False,
    ) -> None:
        super().__init__(batch_size, val_batch_size, num_workers, seed, allow_changed)
        self.dataset = dataset
        self.image_column = image_column
        self.label_column = label_column
        self.img_size = img_size
        self.augment = augment
        self.val_fraction = val_fraction
        if not 0.0 <= test_fraction < 1.0:
            raise ValueError(f"test_fraction={test_fraction!r} must be in [0, 1)")
        self.test_fraction = test_fraction
        self._test: datasets.Dataset | None = None
        self.subset = subset
        self.data_files = data_files
        self.train_split = train_split
        self.val_split = val_split
        self.cache_dir = cache_dir
        self.data_config: dict[str, Any] | None = None
        self._raw: tuple[datasets.Dataset, datasets.Dataset] | None = None

    def raw(self) -> tuple[datasets.Dataset, datasets.Dataset]:
        """The untransformed (train, validation) datasets, loaded once."""
        if self._raw is None:
            if self.dataset == DIGITS:
                train, val = load_digits(self.val_fraction, self.seed, self.cache_dir)
            else:
                train, val = load_raw(
                    self.dataset, self.subset, self.data_files, self.train_split,
                    self.val_split, self.val_fraction, self.seed, cache_dir=self.cache_dir,
                )  # fmt: skip
            columns = {"image": self.image_column, "label": self.label_column}
            for split in (train, val):
                check_columns(split, columns, f"dataset {self.dataset!r}")
            if self.test_fraction > 0:
                labels = isinstance(train.features[self.label_column], datasets.ClassLabel)
                held_out = train.train_test_split(
                    test_size=self.test_fraction,
                    seed=self.seed,
                    stratify_by_column=self.label_column if labels else None,
                )
                train, self._test = held_out["train"], held_out["test"]
            self._raw = (train, val)
        return self._raw

    @property
    def num_labels(self) -> int:
        """Classes in the data."""
        return num_classes(self.raw(), self.label_column)

    def attach(self, module: Any) -> None:
        """Take the model's data config (input size, mean, std) and check the labels fit.

        Raises:
            TypeError: The model lacks what :class:`kiln.models.contract.ImageModel` lists.
        """
        require_members(module, ImageModel, "ImageClassificationData")
        if module.num_classes < self.num_labels:
            raise ValueError(
                f"the model has num_classes={module.num_classes} but {self.dataset!r} has "
                f"{self.num_labels} classes; use num_classes={self.num_labels} (or None to infer)"
            )
        config = dict(module.data_config)
        if self.img_size is not None:
            config["input_size"] = (config["input_size"][0], self.img_size, self.img_size)
            if config["input_size"] != tuple(module.data_config["input_size"]):
                module.check_input_size(config["input_size"])
        self.data_config = config

    def _setup(self) -> None:
        if self.data_config is None:
            raise RuntimeError("attach the data module to a model first (create_model(..., data=))")
        from timm.data.transforms_factory import create_transform

        cfg = self.data_config
        channels = cfg["input_size"][0]
        common = {
            "input_size": cfg["input_size"],
            "interpolation": cfg["interpolation"],
            "mean": cfg["mean"][:channels] if channels == 3 else (float(np.mean(cfg["mean"])),),
            "std": cfg["std"][:channels] if channels == 3 else (float(np.mean(cfg["std"])),),
        }
        val_tf = create_transform(**common, is_training=False, crop_pct=1.0)
        train_tf = (
            create_transform(**common, is_training=True, hflip=0.0, scale=(0.8, 1.0))
            if self.augment
            else val_tf
        )
        mode = "RGB" if channels == 3 else "L"
        train, val = self.raw()
        self.train_set = train.with_transform(self._transform(train_tf, mode))
        self.val_set = val.with_transform(self._transform(val_tf, mode))
        if self._test is not None:
            self.test_set = self._test.with_transform(self._transform(val_tf, mode))

    def _transform(self, transform: Any, mode: str):
        from PIL import Image

        def apply(rows: dict[str, list]) -> dict[str, Any]:
            images = [
                (img if isinstance(img, Image.Image) else Image.fromarray(np.asarray(img)))
                for img in rows[self.image_column]
            ]
            return {
                "pixel_values": [transform(img.convert(mode)) for img in images],
                "labels": [torch.tensor(label) for label in rows[self.label_column]],
            }

        return apply
