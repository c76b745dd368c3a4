"""What compilation cost a run.

:class:`CompileWatch` reads torch's own compile metrics: how long dynamo, AOT autograd and
inductor spent compiling (reported on its own, never mixed into step time), how often frames
recompiled and why, and where graphs broke. A recompile while the loop validates is counted
apart as well: validation's first forward runs without grad, a mode the training graph's
guards reject, so every compiled job that validates compiles one graph more there.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections import Counter
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import torch
import torch._dynamo.utils as dynamo_utils

from kiln.core.telemetry.records import CacheFigures, CompileFigures

_MAX_REASONS = 5
_MAX_REASON_CHARS = 240


def _short(reason: str) -> str:
    """First line of a dynamo message, with its explanation when there is one."""
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    if not lines:
        return reason
    text = lines[0]
    if len(lines) > 1 and lines[1].startswith("Explanation:"):
        text += " (" + lines[1].removeprefix("Explanation:").strip() + ")"
    return text if len(text) <= _MAX_REASON_CHARS else text[: _MAX_REASON_CHARS - 3] + "..."


def _recompile_reason(record: Any) -> str:
    """``"<function> (<file>:<line>): <guard failure>"`` of one recompile, on one line."""
    where = f"{record.co_name or '?'} ({record.co_filename or '?'}:{record.co_firstlineno})"
    failure = str(
        record.recompile_reason
        or _logged_guard_failure(record.co_name, record.co_filename, record.co_firstlineno)
        or "guard failure not recorded"
    ).split("\nUser stack trace:")[0]  # the guard and its source line; the stack is long
    text = f"{where}: " + "; ".join(line.strip() for line in failure.splitlines() if line.strip())
    limit = 2 * _MAX_REASON_CHARS
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _logged_guard_failure(name: str | None, filename: str | None, line: int | None) -> str:
    """Dynamo's latest logged guard failure of a function (a record without its reason)."""
    for code, failures in dynamo_utils.guard_failures.items():
        if failures and (code.co_name, code.co_filename, code.co_firstlineno) == (
            name,
            filename,
            line,
        ):
            return str(failures[-1]).split("\nUser stack trace:")[0]
    return ""


_GRAPH_BREAK_LOGGER = "torch._dynamo.symbolic_convert.__graph_breaks"
"""Dynamo's ``graph_breaks`` log artifact (``TORCH_LOGS=graph_breaks`` prints it): one
message per graph break with the user source line and the reason."""
_BREAK_MESSAGE = re.compile(
    r"in user code at (?P<site>.+?:\d+)\nGraph Break Reason: (?P<why>.*)", re.S
)


class _GraphBreakLog(logging.Handler):
    """Keeps dynamo's graph-break messages as (user source line, short reason) counts.

    dynamo's ``graph_break`` counter misses some breaks (data-dependent branching is
    counted as ``unimplemented``) and names no source line; its log has every break.
    """

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.breaks: Counter[tuple[str, str]] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        match = _BREAK_MESSAGE.search(record.getMessage())
        if match is None:
            return
        lines = [line for line in match["why"].splitlines() if line.strip()]
        if lines and lines[0].startswith("Encountered graph break when attempting"):
            lines = lines[1:]  # the generic preamble; the next line names the break
        self.breaks[(match["site"], _short("\n".join(lines) or match["why"]))] += 1


def _graph_break_log() -> _GraphBreakLog:
    """The process's :class:`_GraphBreakLog`, attached to dynamo's log on first use."""
    logger = logging.getLogger(_GRAPH_BREAK_LOGGER)
    for handler in logger.handlers:
        if isinstance(handler, _GraphBreakLog):
            return handler
    if not logger.isEnabledFor(logging.DEBUG):
        # Nobody asked torch to print graph breaks (TORCH_LOGS): record them, print nothing.
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
    handler = _GraphBreakLog()
    logger.addHandler(handler)
    return handler


class CompileWatch:
    """Compile time, recompiles and graph breaks of ``torch.compile`` since :meth:`start`.

    Reads torch's structured compilation metrics (one record per frame compile, lazy
    backward compile or runtime autotune, with its duration) and dynamo's counters and
    guard-failure log. Call :meth:`start` before compiling, :meth:`check` at log
    intervals, :meth:`snapshot` for the figures.

    Args:
        threshold: Warn once when the run has recompiled this many times.
    """

    def __init__(self, threshold: int) -> None:
        if threshold < 1:
            raise ValueError(f"threshold={threshold} is not valid; it must be >= 1")
        self.threshold = threshold
        self._compile_seconds = 0.0
        # (name, file, first line, cached entries at the time) of each recompiled frame
        self._recompiled: list[tuple[str, str, int | None, int]] = []
        self._recompile_reasons: list[str] = []  # dynamo's guard failure, per recompile
        self._validation_recompiles = 0
        self._validating = False
        self._last_seen: object | None = None
        self._missed = False
        self._warned = False
        self.compiled_blocks = 0  # blocks compiled in place (compile.regional)

    def start(self) -> None:
        """Start from a fresh in-memory dynamo state, as a new process would.

        Resets dynamo's code caches (compiled frames, automatic-dynamic shape state), its
        counters, guard-failure log and compilation metrics, so what a run reports does not
        depend on what was compiled before it in the process. On-disk caches are kept.
        """
        # else a second run reuses the first one's graphs, uncounted (no public reset)
        torch.compiler.reset()
        _graph_break_log().breaks.clear()
        dynamo_utils.counters.clear()
        dynamo_utils.guard_failures.clear()
        dynamo_utils.clear_compilation_metrics()
        self._compile_seconds = 0.0
        self._recompiled.clear()
        self._recompile_reasons.clear()
        self._validation_recompiles = 0
        self._validating = False
        self._last_seen = None
        self._missed = False
        self._warned = False

    def _collect(self) -> None:
        """Fold in the compilation records added since the last call."""
        records = dynamo_utils.get_compilation_metrics()
        start = 0
        if self._last_seen is not None:
            # torch keeps the newest records only (a bounded deque): find where we left off
            index = next((i for i, r in enumerate(records) if r is self._last_seen), None)
            if index is None:
                self._missed = bool(records)
            else:
                start = index + 1
        for record in records[start:]:
            if record.duration_us is not None:
                self._compile_seconds += record.duration_us / 1e6
            elif record.entire_frame_compile_time_s is not None:
                self._compile_seconds += record.entire_frame_compile_time_s
            # a frame compiled while it already had cached code is a recompile
            if record.is_forward is not False and not record.is_runtime and record.cache_size:
                self._recompiled.append(
                    (
                        record.co_name or "?",
                        record.co_filename or "?",
                        record.co_firstlineno,
                        record.cache_size,
                    )
                )
                if self._validating:
                    self._validation_recompiles += 1
                if len(self._recompile_reasons) < _MAX_REASONS:
                    where = "validation: " if self._validating else ""
                    self._recompile_reasons.append(where + _recompile_reason(record))
        if records:
            self._last_seen = records[-1]

    @contextmanager
    def validating(self) -> Generator[None, None, None]:
        """The loop's validation: what compiles inside is counted as validation's too."""
        self.validation_started()
        try:
            yield
        finally:
            self.validation_ended()

    def validation_started(self) -> None:
        """What compiles from now on is counted as validation's too."""
        self._collect()  # what compiled before is training's
        self._validating = True

    def validation_ended(self) -> None:
        self._collect()
        self._validating = False

    def _guard_failures(self, limit: int = 3) -> list[str]:
        """The latest guard failure of each recompiled function (what changed)."""
        reasons: dict[str, str] = {}
        for name, filename, line, cached in reversed(self._recompiled):  # newest first
            where = f"{name} ({filename}:{line})"
            if where in reasons:
                continue
            for code, failures in dynamo_utils.guard_failures.items():
                if (code.co_name, code.co_filename, code.co_firstlineno) == (name, filename, line):
                    # a recompile logs one failure per cached entry, most recently used
                    # first: that one says how the input differs from recent calls
                    failure = failures[-min(cached, len(failures))] if failures else "?"
                    reasons[where] = failure.split("\nUser stack trace:")[0]
                    break
            if len(reasons) >= limit:
                break
        return [f"{where}: {reason}" for where, reason in reasons.items()]

    def snapshot(self) -> CompileFigures:
        """Compile figures since :meth:`start`.

        Returns:
            ``compile_time_s`` (seconds torch spent compiling: dynamo tracing, AOT autograd,
            inductor, lazy backward compiles, runtime autotuning), ``recompiles`` (all, as
            dynamo counts them) and ``validation_recompiles`` (those while validating),
            ``graph_breaks`` (graph breaks dynamo logged while compiling, per compile),
            ``unique_graphs``, ``graph_break_reasons`` (the five most frequent, shortened,
            each ending with its user source line ``(at file.py:123)``),
            ``graph_break_sites`` (their ``path:line``),
            ``recompile_reasons`` (the first five recompiles: the function and dynamo's
            guard failure, i.e. what changed; ``validation: `` first for validation's),
            ``compiled_blocks`` (regional compile) and which on-disk caches hit
            (``compile_cache``: cold, warm or partial; see
            ``cache_figures``).
        """
        self._collect()
        logged = _graph_break_log().breaks.most_common()
        counted = dynamo_utils.counters["graph_break"]  # a fallback if the log's form changes
        if logged:
            count = sum(n for _, n in logged)
            top = logged[:_MAX_REASONS]
            reasons = [f"{why} (at {Path(site).name})" for (site, why), _ in top]
            sites = [site for (site, _), _ in top]
        else:
            count = int(sum(counted.values()))
            reasons = [_short(r) for r, _ in counted.most_common(_MAX_REASONS)]
            sites = []
        return {
            "compile_time_s": self._compile_seconds,
            "recompiles": len(self._recompiled),
            "validation_recompiles": self._validation_recompiles,
            "graph_breaks": count,
            "unique_graphs": int(dynamo_utils.counters["stats"]["unique_graphs"]),
            "graph_break_reasons": reasons,
            "graph_break_sites": sites,
            "recompile_reasons": list(self._recompile_reasons),
            "compiled_blocks": self.compiled_blocks,
            # the loop's cache_figures returns CacheFigures' keys (its annotation is a dict)
            **cast(CacheFigures, cache_figures(dynamo_utils.counters)),
        }

    def check(self) -> None:
        """Warn once, naming what changed, when recompiles reach the threshold."""
        self._collect()
        count = len(self._recompiled)
        if self._warned or count < self.threshold:
            return
        self._warned = True
        failures = "\n".join(f"  - {r}" for r in self._guard_failures()) or "  (not recorded)"
        missed = " (some compile records were dropped; the count is a lower bound)"
        warnings.warn(
            f"torch.compile has recompiled {count} times{missed if self._missed else ''} "
            f"(compile.recompile_warn_threshold={self.threshold}). Latest guard failures, "
            f"i.e. what changed:\n{failures}\n"
            "Each recompile costs compile time. Keep input shapes static (fixed padding or a "
            "few length buckets, drop_last=True), keep changing Python values out of the "
            "compiled code, or set compile.dynamic=true.",
            stacklevel=2,
        )


def cache_figures(counters: Any) -> dict[str, int | str | None]:
    """Which on-disk compile caches hit since dynamo's counters were cleared.

    Returns:
        ``fx_graph_cache_hits``/``_misses``, ``aot_autograd_cache_hits``/``_misses`` and
        ``compile_cache``: ``"warm"`` (only hits), ``"cold"`` (only misses), ``"partial"``,
        or ``None`` when nothing was looked up (eager, or caches off).
    """
    inductor, aot = counters["inductor"], counters["aot_autograd"]
    counts = {
        "fx_graph_cache_hits": int(inductor["fxgraph_cache_hit"]),
        "fx_graph_cache_misses": int(inductor["fxgraph_cache_miss"]),
        "aot_autograd_cache_hits": int(aot["autograd_cache_hit"]),
        "aot_autograd_cache_misses": int(aot["autograd_cache_miss"]),
    }
    hits = counts["fx_graph_cache_hits"] + counts["aot_autograd_cache_hits"]
    misses = counts["fx_graph_cache_misses"] + counts["aot_autograd_cache_misses"]
    state = "partial" if hits and misses else "warm" if hits else "cold" if misses else None
    return {**counts, "compile_cache": state}
