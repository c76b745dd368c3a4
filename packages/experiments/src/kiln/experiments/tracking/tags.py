"""The W&B tags of a job: what it ran, so runs filter by model, precision, compile mode."""

from __future__ import annotations

from collections.abc import Iterable


def run_tags(
    model: str,
    precision: str,
    compile_mode: str,
    *,
    kind: str | None = None,
    tiny: bool = False,
    devices: int | None = None,
    extra: Iterable[str] = (),
) -> list[str]:
    """``[kind, model:..., tiny, precision:..., compile:..., devices:..., *extra]``: one tag
    per key, so filtering on ``model:`` finds each run once.

    Args:
        model: The model's name (or label, e.g. ``timm:resnet18``).
        precision: The Fabric precision.
        compile_mode: ``compile.mode``.
        kind: A leading tag naming the job's kind (``bench``); ``None`` for none.
        tiny: Add ``tiny`` (``debug=fast``: the model's test-sized variant).
        devices: Processes of the job over all nodes; ``None`` leaves the tag out.
        extra: The config's own tags.
    """
    return [
        *([kind] if kind else []),
        f"model:{model}",
        *(["tiny"] if tiny else []),
        f"precision:{precision}",
        f"compile:{compile_mode}",
        *([f"devices:{devices}"] if devices is not None else []),
        *extra,
    ]
