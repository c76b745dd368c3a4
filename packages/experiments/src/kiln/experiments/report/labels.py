"""Short labels for a report's runs: only the overrides that differ between them.

A sweep's run names repeat what every job shares (``debug=fast,trainer.max_steps=30,...``);
a legend or table cell holding it all hides the one override that tells two lines apart.
"""

from __future__ import annotations

from collections.abc import Sequence


def split_overrides(name: str) -> list[str]:
    """``"a=1,b=[x,y]"`` -> ``["a=1", "b=[x,y]"]``: the commas outside brackets and quotes."""
    parts, depth, quote, current = [], 0, "", ""
    for char in name:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[({":
            depth += 1
        elif char in "])}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += char
    return [*parts, current] if current or parts else []


def differing_labels(names: Sequence[str], sep: str = ",") -> tuple[list[str], list[str]]:
    """Each run's label without the overrides every run shares, and those shared ones.

    Args:
        names: The runs' names (comma-joined overrides, as ``report.train.run_name``).
        sep: What joins a label's overrides.

    Returns:
        One label per name (``"compile=default"``, floats :func:`short`; a run that differs
        in nothing keeps its whole name) and the shared overrides, in first-seen order (for a
        caption).
    """
    split = [split_overrides(n) for n in names]
    shared = [o for o in (split[0] if len(split) > 1 else []) if all(o in s for s in split[1:])]
    labels = [
        sep.join(short(o) for o in parts if o not in shared) or name
        for parts, name in zip(split, names, strict=True)
    ]
    return labels, shared


def short(override: str) -> str:
    """``"optimizer.lr=0.00018662266976517952"`` -> ``"optimizer.lr=0.0001866"``: a float
    value to 4 significant digits (a study's sampled values), anything else as it is."""
    key, eq, value = override.partition("=")
    if not eq or len(value) <= 8:
        return override
    try:
        return f"{key}={float(value):.4g}"
    except ValueError:
        return override
