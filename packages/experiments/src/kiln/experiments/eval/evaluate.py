"""Run a module's ``validation_step`` over a split of its data module and compute its metrics."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

SPLITS = {"validation": ("val_dataloader", "val"), "test": ("test_dataloader", "test")}
"""split name -> (the data module's loader method, the metrics' prefix)."""


def check_limit_batches(limit_batches: int | None) -> None:
    """Refuse a batch limit below 1 (no batch: no metric to compute).

    Raises:
        ValueError: Names the value and what is valid.
    """
    if limit_batches is not None and limit_batches < 1:
        raise ValueError(
            f"--limit-batches={limit_batches} is not valid: give a number of batches >= 1, "
            "or leave it out to evaluate every batch"
        )


def evaluate(
    module: Any, split: str = "validation", limit_batches: int | None = None, generate: bool = True
) -> dict:
    """The module's metrics (``validation_metrics``) on ``split`` of its data module.

    Args:
        module: A kiln module with its data module, in eval mode.
        split: ``validation`` or ``test`` (where the data module has ``test_dataloader``).
        limit_batches: Evaluate the first N batches only (``None``: all; at least 1).
        generate: Score a generating module's generations too (see below).

    A module that generates (``generate_texts(batch) -> (predictions, references)`` and
    ``generation_metrics(predictions, references)``, as the seq2seq wrapper has) also gets
    its generated text scored over the same batches, as ``<prefix>/generated_<metric>``
    (exact match: whitespace-stripped, case-sensitive), unless ``generate=False``.

    Returns:
        ``{"<val|test>/<metric>": value}``.

    Raises:
        ValueError: An unknown split, one the data module does not have, a limit below 1,
            or a split that yields no batch.
    """
    import torch

    check_limit_batches(limit_batches)
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not valid; use one of: {', '.join(SPLITS)}")
    method, prefix = SPLITS[split]
    data = module.data_module
    if data is None or not callable(getattr(data, method, None)):
        raise ValueError(
            f"the data module {type(data).__name__} has no {split} split (no {method}()); "
            f"use split=validation"
        )
    outputs: dict[str, list[torch.Tensor]] = defaultdict(list)
    generate_texts: Any = getattr(module, "generate_texts", None) if generate else None
    texts: tuple[list[str], list[str]] = ([], [])
    module.eval()
    device = next(module.parameters()).device  # a module just trained may sit on a GPU
    with torch.no_grad():
        for i, batch in enumerate(getattr(data, method)()):
            if limit_batches is not None and i >= limit_batches:
                break
            batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
            for key, value in module.validation_step(batch, i).items():
                outputs[key].append(value.detach())
            if generate_texts is not None:
                predictions, references = generate_texts(batch)
                texts[0].extend(predictions)
                texts[1].extend(references)
    if not outputs:
        raise ValueError(f"the {split} split yielded no batch: there is nothing to evaluate")
    metrics = module.validation_metrics({k: torch.cat(v) for k, v in outputs.items()})
    if generate_texts is not None:
        generated = module.generation_metrics(*texts)
        metrics |= {f"generated_{k}": v for k, v in generated.items()}
    return {f"{prefix}/{k}": float(v) for k, v in metrics.items()}
