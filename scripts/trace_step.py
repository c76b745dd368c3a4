"""Which of kiln.core's code one steady-state logged step runs: files, functions and lines.

    uv run --all-packages python scripts/trace_step.py [--json]

Trains a tiny BERT classifier (random init, 64 samples) through ``kiln.core.fit`` with
``TrainerConfig``'s defaults on the CPU (a log row every 10 steps, the machine sampler, the
progress bar, FLOP counting), and traces with ``sys.setprofile`` from the start of step 10's
window to the start of step 11's: step 10 whole, its log row, the stop poll and the next
window's data. Every kiln.core function that runs there (called, or already running and
running lines: the loop, the step) is counted once, whole, with its lines of code (the
source without blank lines, comments and docstrings). What runs inside a callback point's
``on_*`` method is the callback's, and counted apart.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

CORE = str(Path(__file__).resolve().parents[1] / "packages" / "core" / "src" / "kiln" / "core")
STEP = 10


def code_lines(code: types.CodeType) -> int:
    """Lines of ``code``'s function that are code: no blank line, comment or docstring."""
    source = textwrap.dedent("".join(inspect.getsourcelines(code)[0]))
    tree = ast.parse(source)
    function = tree.body[0]
    skip: set[int] = set()
    for node in ast.walk(function):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value  # pyright: ignore[reportAttributeAccessIssue]
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                skip.update(range(body[0].lineno, (body[0].end_lineno or 0) + 1))
    lines = source.splitlines()
    return sum(
        1
        for number, line in enumerate(lines, start=1)
        if number not in skip and line.strip() and not line.strip().startswith("#")
    )


class Tracer:
    """``sys.setprofile`` over kiln.core, split into the step's own path and callbacks."""

    def __init__(self) -> None:
        self.path: dict[types.CodeType, None] = {}
        self.callbacks: dict[types.CodeType, None] = {}
        self._stack: list[bool] = []  # per open frame: inside a callback point

    def start(self) -> None:
        sys.setprofile(self._event)

    def stop(self) -> None:
        sys.setprofile(None)

    def _event(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if event == "call":
            if not self._stack:  # its caller was running when tracing began: it runs lines
                self._running(frame.f_back)
            inside = (bool(self._stack) and self._stack[-1]) or _is_point(frame.f_code)
            self._stack.append(inside)
            if frame.f_code.co_filename.startswith(CORE):
                (self.callbacks if inside else self.path)[frame.f_code] = None
        elif event == "return":
            if self._stack:
                self._stack.pop()
            else:  # a frame that was running when tracing began
                self._running(frame)

    def _running(self, frame: types.FrameType | None) -> None:
        """A frame that was running when tracing began (the loop, the step, the dispatcher
        of the tracer's own point) and ran lines in the window: on the path unless a point."""
        if frame is not None and frame.f_code.co_filename.startswith(CORE):
            if not _is_point(frame.f_code):
                self.path[frame.f_code] = None

    def figures(self) -> dict[str, Any]:
        def count(codes: dict[types.CodeType, None]) -> dict[str, Any]:
            # a comprehension's lines are its function's
            functions = sorted(
                (Path(c.co_filename).relative_to(CORE).as_posix(), c.co_qualname, code_lines(c))
                for c in codes
                if "<locals>" not in c.co_qualname
            )
            return {
                "files": sorted({f for f, _, _ in functions}),
                "functions": len(functions),
                "lines": sum(n for _, _, n in functions),
                "by_function": [f"{f}:{q} ({n})" for f, q, n in functions],
            }

        return {"step_path": count(self.path), "callbacks": count(self.callbacks)}


def _is_point(code: types.CodeType) -> bool:
    return code.co_name.startswith("on_")


class TraceOneStep:
    """A callback that traces from step ``STEP``'s window to the next one's."""

    def __init__(self) -> None:
        self.tracer = Tracer()
        self._windows = 0

    def on_window_start(self, window: list[Any]) -> None:
        self._windows += 1
        if self._windows == STEP:
            self.tracer.start()
        elif self._windows == STEP + 1:
            self.tracer.stop()


def trace() -> dict[str, Any]:
    import lightning as L

    from kiln.core import TrainerConfig, fit
    from kiln.models import create_model
    from kiln.models.data import TextClassificationData

    L.seed_everything(0, verbose=False)
    module = create_model(
        "bert-tiny-cls",
        data=TextClassificationData(batch_size=8, num_train=64, num_val=16, max_length=32),
    )
    tracer = TraceOneStep()
    fit(module, TrainerConfig(accelerator="cpu", max_steps=STEP + 2), callbacks=[tracer])
    return tracer.tracer.figures()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    figures = trace()
    if args.json:
        print(json.dumps(figures, indent=1))
        return 0
    for part in ("step_path", "callbacks"):
        f = figures[part]
        print(f"{part}: {len(f['files'])} kiln.core files, {f['functions']} functions, "
              f"{f['lines']} lines")  # fmt: skip
        for line in f["by_function"]:
            print(f"  {line}")
        print(f"  files: {', '.join(f['files'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
