"""Side by side: where the step time of two paired runs goes (``profile=steps`` runs).

For every comparison a report makes (eager vs compiled, fp32 vs AMP, DDP vs FSDP, fewer vs
more devices), the two runs' :class:`~kiln.core.telemetry.profile.StepBreakdown` category
by category: ``attention 41.0 -> 18.0 ms/step; ... ; ops 310 -> 40/step``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kiln.core.telemetry.profile import CATEGORY_ORDER
from kiln.experiments.report.pairing import pair_key


@dataclass(frozen=True)
class Comparison:
    """One kind of pair: the config keys its two runs differ in, and which run is the base."""

    name: str
    keys: tuple[str, ...]
    label: Callable[[dict[str, Any]], str]
    is_base: Callable[[dict[str, Any]], bool]


def _compile(rec: dict[str, Any]) -> str:
    return f"compile={rec.get('compile_mode') or 'none'}"


def _precision(rec: dict[str, Any]) -> str:
    return f"precision={rec.get('precision')}"


def _strategy(rec: dict[str, Any]) -> str:
    config = rec.get("config") or {}
    return f"strategy={(config.get('trainer') or {}).get('strategy', 'auto')}"


def _devices(rec: dict[str, Any]) -> str:
    return f"{rec.get('devices') or 1} devices"


COMPARISONS = (
    Comparison("compile", ("compile",), _compile, lambda r: _compile(r) == "compile=none"),
    Comparison(
        "precision",
        ("trainer.precision",),
        _precision,
        lambda r: _precision(r) == "precision=32-true",
    ),
    Comparison(
        "strategy",
        ("trainer.strategy",),
        _strategy,
        lambda r: _strategy(r) in ("strategy=ddp", "strategy=auto"),
    ),
    Comparison(
        "devices",
        ("trainer.devices", "trainer.num_nodes"),
        _devices,
        lambda r: (r.get("devices") or 1) == 1,
    ),
)


@dataclass
class ProfilePair:
    """Two profiled runs that differ in one comparison's keys only."""

    comparison: str
    base: dict[str, Any]
    other: dict[str, Any]

    @property
    def title(self) -> str:
        return f"{self.label(self.base)} -> {self.label(self.other)} ({self.base.get('model')})"

    def label(self, record: dict[str, Any]) -> str:
        """What tells ``record`` apart in this pair (``compile=default``)."""
        return next(c for c in COMPARISONS if c.name == self.comparison).label(record)


def host_ms(record: dict[str, Any]) -> dict[str, float]:
    """A profiled record's milliseconds per category and step (empty without a profile)."""
    return (_breakdown(record) or {}).get("host_ms", {})


def _breakdown(record: dict[str, Any]) -> dict[str, Any] | None:
    return ((record.get("profile") or {}).get("breakdown")) or None


def profile_pairs(records: list[dict[str, Any]]) -> list[ProfilePair]:
    """Every (base, other) pair of profiled runs, per comparison, in the records' order."""
    profiled = [r for r in records if _breakdown(r)]
    pairs: list[ProfilePair] = []
    for comparison in COMPARISONS:
        groups: dict[tuple, list[dict[str, Any]]] = {}
        for record in profiled:
            groups.setdefault(pair_key(record, comparison.keys, ()), []).append(record)
        for group in groups.values():
            bases = [r for r in group if comparison.is_base(r)]
            label = comparison.label
            for other in group:
                if bases and not comparison.is_base(other) and label(other) != label(bases[0]):
                    pairs.append(ProfilePair(comparison.name, bases[0], other))
    return pairs


def categories(pair: ProfilePair, clock: str = "host_ms") -> list[tuple[str, float, float]]:
    """``(category, base ms, other ms)`` per step, in :data:`CATEGORY_ORDER`, for the categories
    either run spent time in: on the host's clock (``host_ms``, the step's wall time) or the
    GPU kernels' (``device_ms``, CUDA runs only)."""
    a, b = _breakdown(pair.base) or {}, _breakdown(pair.other) or {}
    ha, hb = a.get(clock) or {}, b.get(clock) or {}
    return [(c, ha.get(c, 0.0), hb.get(c, 0.0)) for c in CATEGORY_ORDER if c in ha or c in hb]


def compact_line(pair: ProfilePair) -> str:
    """One line for the terminal: each category's ms/step, base -> other, the ops, and on
    CUDA the kernels (count and time)."""
    a, b = _breakdown(pair.base) or {}, _breakdown(pair.other) or {}
    parts = [f"{c} {x:.1f} -> {y:.1f}" for c, x, y in categories(pair)]
    ops = f"ops {a.get('ops_per_step', 0):.0f} -> {b.get('ops_per_step', 0):.0f}/step"
    if a.get("kernels_per_step") or b.get("kernels_per_step"):
        ops += (
            f", kernels {a.get('kernels_per_step') or 0:.0f} -> "
            f"{b.get('kernels_per_step') or 0:.0f}/step"
        )
    gpu = categories(pair, "device_ms")
    if gpu:
        total = f"{sum(x for _, x, _ in gpu):.2f} -> {sum(y for _, _, y in gpu):.2f}"
        ops += (
            f" ({total} kernel ms/step: "
            + "; ".join(f"{c} {x:.2f} -> {y:.2f}" for c, x, y in gpu)
            + ")"
        )
    step = f"step {a.get('step_ms', 0):.1f} -> {b.get('step_ms', 0):.1f} ms"
    return f"{pair.title}: {step}; " + "; ".join(parts) + f" (ms/step); {ops}"


def markdown(pairs: list[ProfilePair]) -> list[str]:
    """The report's section: a table per pair."""
    if not pairs:
        return []
    lines = [
        "",
        "## Where the step time goes (profiled runs, side by side)",
        "",
        "Each op's own time in the category of its name or an enclosing op's; host overhead "
        "and idle is the rest of the step's wall time (docs/comparing-runs.md).",
    ]
    for pair in pairs:
        a, b = _breakdown(pair.base) or {}, _breakdown(pair.other) or {}
        lines += ["", f"### {pair.title}", ""]
        lines += _ms_table([*categories(pair), ("step", a["step_ms"], b["step_ms"])])
        lines.append(f"| ops/step | {a['ops_per_step']:.0f} | {b['ops_per_step']:.0f} | |")
        gpu = categories(pair, "device_ms")
        if gpu:  # CUDA: the kernels' own time, which the host's clock overlaps
            total = ("all kernels", sum(x for _, x, _ in gpu), sum(y for _, _, y in gpu))
            lines += ["", "GPU kernels by category:", "", *_ms_table([*gpu, total])]
            lines.append(
                f"| kernels/step | {a.get('kernels_per_step') or 0:.0f} | "
                f"{b.get('kernels_per_step') or 0:.0f} | |"
            )
    return lines


def _ms_table(rows: list[tuple[str, float, float]]) -> list[str]:
    """A markdown table of ``(name, base ms, other ms)`` rows and their ratio."""
    lines = ["| | base ms/step | other ms/step | other/base |", "|---|---|---|---|"]
    for name, x, y in rows:
        lines.append(f"| {name} | {x:.2f} | {y:.2f} | {f'{y / x:.2f}' if x else '-'} |")
    return lines


def table_rows(pairs: list[ProfilePair]) -> list[dict[str, Any]]:
    """One row per pair and category (``profiles.csv``, the W&B report run's table)."""
    return [
        {"pair": p.title, "category": f"{prefix}{c}", "base_ms": x, "other_ms": y}
        for p in pairs
        for clock, prefix in (("host_ms", ""), ("device_ms", "gpu kernels: "))
        for c, x, y in categories(p, clock)
    ]


def bench_profile_pairs(records: list[dict[str, Any]]) -> list[ProfilePair]:
    """The eager and compiled phases of each kiln-bench job profiled with
    ``bench.profile_steps``: one pair per job."""
    pairs: list[ProfilePair] = []
    for record in records:
        profile = record.get("profile") or {}
        eager, compiled = profile.get("eager") or {}, profile.get("compiled") or {}
        if eager.get("breakdown") and compiled.get("breakdown"):
            model = record.get("model")
            base = {"model": model, "compile_mode": "none", "profile": eager}
            other = {
                "model": model,
                "compile_mode": record.get("compile_mode"),
                "profile": compiled,
            }
            pairs.append(ProfilePair("compile", base, other))
    return pairs
