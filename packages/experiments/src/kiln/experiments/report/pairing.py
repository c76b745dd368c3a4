"""Which runs of a sweep a report compares: runs whose *resolved* configs differ only in the
keys a comparison varies (``compile`` for a speedup, the device count for scaling).

Matching the override text would miss equal configs written differently (an explicit
``data.batch_size=8`` that equals the default) and would pair runs whose configs differ
through a sweep file; the resolved config (``record["config"]``) says what each job
computed. Records without one (written before kiln kept it) fall back to the overrides.
"""

from __future__ import annotations

from typing import Any

from kiln.experiments.settings.dotted import flatten
from kiln.experiments.settings.job_info import PLACEMENT_KEYS, identity_overrides, key_in
from kiln.experiments.settings.repeats import REPEAT_KEY

# keys that name, tag or place a job without changing what it computes (runs that differ
# only in the repeat number are repeats of one configuration)
_NOT_COMPUTED = (*PLACEMENT_KEYS, REPEAT_KEY, "tags", "print_config", "compile.cache_dir")


def computed_config(record: dict[str, Any], ignore: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """The record's resolved config as ``{dotted key: value}`` without placement keys
    (paths, logger, launcher, ...), the repeat number and ``ignore``; the job's own directory
    in a value (``trainer.checkpoint_dir``) is replaced by ``<job>``. ``None`` without one."""
    config = record.get("config")
    if not isinstance(config, dict) or not config:
        return None
    job_dir = record.get("output_dir") or record.get("job_dir")
    flat = {}
    for key, value in flatten(config).items():
        if key_in(key, _NOT_COMPUTED + ignore):
            continue
        if job_dir and isinstance(value, str) and str(job_dir) in value:
            value = value.replace(str(job_dir), "<job>")
        flat[key] = value
    return flat


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """``"key a vs b"`` for every key whose value differs between flat configs ``a`` and ``b``."""
    return [
        f"{key} {a.get(key, '<unset>')} vs {b.get(key, '<unset>')}"
        for key in sorted(set(a) | set(b))
        if a.get(key, "<unset>") != b.get(key, "<unset>")
    ]


def pair_key(record: dict[str, Any], ignore: tuple[str, ...], fields: tuple[str, ...]) -> tuple:
    """What identifies a run apart from ``ignore``d keys: its resolved config; for a record
    without one its overrides, or ``fields`` when it has neither."""
    flat = computed_config(record, ignore)
    if flat is not None:
        return ("config", tuple(sorted((k, repr(v)) for k, v in flat.items())))
    if record.get("overrides"):
        overrides = identity_overrides(record["overrides"], (*ignore, REPEAT_KEY))
        return ("overrides", tuple(sorted(overrides)))
    return ("fields", tuple(record.get(f) for f in fields))


def why_unpaired(
    record: dict[str, Any], candidates: list[dict[str, Any]], ignore: tuple[str, ...], what: str
) -> str:
    """Why ``record`` has no partner among ``candidates`` (the runs it could be compared to:
    ``what``, e.g. ``"compile=none run"``): none at all, or how the nearest one differs."""
    if not candidates:
        return f"unpaired: no {what} in the sweep"
    mine = computed_config(record, ignore)
    theirs = [computed_config(c, ignore) for c in candidates]
    if mine is None or any(t is None for t in theirs):
        return f"unpaired: no {what} with the same overrides"
    nearest = min((differences(mine, t) for t in theirs if t is not None), key=len)
    shown = "; ".join(nearest[:3]) + (f"; +{len(nearest) - 3} more" if len(nearest) > 3 else "")
    return f"unpaired: the nearest {what} differs in {shown}"
