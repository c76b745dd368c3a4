"""Crash points: kill a kiln-train job wherever it writes its record, re-run it, and compare
the whole record with an uninterrupted run's (SQLite's crash tests, ALICE).

The points come from the code, not from a list: a reference run records every call of the
three places a job's record changes through,

- ``kiln.core.atomic.replace_synced`` (its ``commit_observers``): every file of the job's
  record (``summary.json``, ``attempts.json``, ``.hydra/*``, ``wandb_run_id``, ...), every
  checkpoint directory and ``run.json``;
- ``KilnWandbLogger.log_metrics``: every W&B history row (train, validation);
- ``Tracker.finish``: the W&B run's end,

each named by its kind (the file relative to the job directory, step numbers as ``*``; or
``wandb:<row kind>``, ``wandb:finish``). Each case kills a fresh job at one occurrence of one
kind (SIGKILL right after the write; SIGTERM for the graceful path), runs the same command
again (a second time after a SIGTERM stop: the first re-run resumes it), and compares:
checkpoint tensors, ``summary.json``'s history, validation history and metrics, the W&B rows
read back from the run's ``.wandb`` files (each of the record's rows exactly once, one run id,
an exit record), Hydra's files and the attempts.

One process imports kiln, torch and transformers once and forks a child for each run (no
torch work happens before the fork), so a run costs its training, not its start-up.

    python tests/experiments/crash_points.py OUT_DIR            # first and last of each kind
    python tests/experiments/crash_points.py OUT_DIR --every    # every occurrence (make test-crash)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ARGS = [
    "debug=fast",
    "compile.backend=aot_eager",
    "trainer.max_steps=4",
    "trainer.log_every_n_steps=1",
    "trainer.val_every_n_steps=2",
    "trainer.checkpoint_every_n_steps=2",
]
"""The job every case runs: 4 steps, a row each, validation and a checkpoint every 2."""

ENV = {
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


@dataclass
class Case:
    kind: str
    occurrence: int  # 1-based, among the reference run's points of this kind
    of: int  # how many the reference run has
    signal: str  # SIGKILL or SIGTERM
    verdict: str = ""
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.kind}#{self.occurrence}/{self.of}-{self.signal}"


def point_kind(path: Path, job_dir: Path) -> str | None:
    """A committed path's kind: relative to the job directory, step numbers as ``*``
    (``None``: not the job's)."""
    try:
        relative = path.resolve().relative_to(job_dir.resolve())
    except ValueError:
        return None
    return re.sub(r"\d{8}", "*", str(relative))


def _observe(job_dir: Path, on_point: Callable[[str], None]) -> None:
    """Call ``on_point(kind)`` after each write of the job's record (in the child)."""
    from kiln.core import atomic
    from kiln.experiments.tracking.tracker import Tracker
    from kiln.experiments.tracking.wandb_files import row_kind
    from kiln.experiments.tracking.wandb_logger import SUMMARY_PREFIXES, KilnWandbLogger

    def committed(path: Path) -> None:
        kind = point_kind(path, job_dir)
        if kind is not None:
            on_point(kind)

    atomic.commit_observers.append(committed)
    log_metrics, finish = KilnWandbLogger.log_metrics, Tracker.finish

    def logged(self: Any, metrics: Any, step: int | None = None) -> None:
        log_metrics(self, metrics, step)
        row = {k: v for k, v in metrics.items() if not k.startswith(SUMMARY_PREFIXES)}
        if row:
            on_point(f"wandb:{row_kind(row)}")

    def finished(self: Any, *args: Any, **kwargs: Any) -> None:
        finish(self, *args, **kwargs)
        on_point("wandb:finish")

    KilnWandbLogger.log_metrics = logged  # type: ignore[method-assign]
    Tracker.finish = finished  # type: ignore[method-assign]


def run_job(job_dir: Path, log: Path, setup: Callable[[], None] | None = None) -> int:
    """``kiln-train ARGS hydra.run.dir=job_dir`` in a forked child; its exit status
    (``-9``: killed by SIGKILL)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    pid = os.fork()
    if pid == 0:  # the child: one kiln-train run
        code = 1
        try:
            out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.environ.update({**ENV, "KILN_LOG_DIR": str(job_dir.parent / "logs")})
            sys.argv = ["kiln-train", *ARGS, f"hydra.run.dir={job_dir}"]
            if setup is not None:
                setup()
            from kiln.experiments.train.cli import main

            main()
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def record_points(job_dir: Path, trace: Path) -> list[str]:
    """The uninterrupted reference run: every point, in order."""

    def setup() -> None:
        def on_point(kind: str) -> None:
            with open(trace, "a") as handle:
                handle.write(kind + "\n")

        _observe(job_dir, on_point)

    code = run_job(job_dir, job_dir.parent / "reference.log", setup)
    if code != 0:
        raise RuntimeError(f"the reference run exited {code}: see {job_dir.parent}")
    return trace.read_text().split()


def kill_at(job_dir: Path, log: Path, kind: str, occurrence: int, signum: int) -> int:
    """Run the job and send ``signum`` to itself right after the ``occurrence``-th write of
    ``kind``."""

    def setup() -> None:
        seen = {"n": 0}

        def on_point(point: str) -> None:
            if point != kind:
                return
            seen["n"] += 1
            if seen["n"] == occurrence:
                os.kill(os.getpid(), signum)

        _observe(job_dir, on_point)

    return run_job(job_dir, log, setup)


# -- comparing a record with the reference's ------------------------------------------------


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def _flat_tensors(prefix: str, value: Any, into: dict[str, Any]) -> dict[str, Any]:
    import torch

    if isinstance(value, dict):
        for key, item in value.items():
            _flat_tensors(f"{prefix}.{key}", item, into)
    elif isinstance(value, torch.Tensor):
        into[prefix] = value
    return into


def _tensors(job_dir: Path, scratch: Path) -> dict[str, dict[str, Any]]:
    """Every checkpoint's tensors (model and optimizer), by checkpoint name."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    found = {}
    for path in sorted((job_dir / "checkpoints").glob("step-*.ckpt")):
        whole = scratch / f"{job_dir.name}-{path.name}.pt"
        dcp_to_torch_save(path, whole)
        found[path.name] = _flat_tensors("", torch.load(whole, weights_only=False), {})
        whole.unlink()
    return found


def _same_tensors(a: dict[str, Any], b: dict[str, Any]) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _wandb_rows(job_dir: Path) -> tuple[list[dict[str, Any]], set[str], bool]:
    """The W&B history rows of every attempt of the job's run(s), the run ids found in its
    ``wandb/`` directory, and whether the last attempt's file ends the run."""
    from kiln.experiments.tracking.wandb_files import has_exit, read_history, run_files

    run_dirs = sorted((job_dir / "wandb").glob("offline-run-*"))
    ids = {d.name.rsplit("-", 1)[-1] for d in run_dirs}
    run_id = (job_dir / "wandb_run_id").read_text().strip()
    files = run_files(job_dir, run_id)
    rows = [row for file in files for row in read_history(file)]
    return rows, ids, bool(files) and has_exit(files)


def _wandb_rows_by_key(rows: list[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Each W&B history row's values by ``(kind, step)`` (a key logged twice: two entries)."""
    from kiln.experiments.tracking.tracker import STEP_METRIC
    from kiln.experiments.tracking.wandb_files import row_key

    found: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        key = row_key(row, STEP_METRIC)
        if key is not None:
            values = {k: v for k, v in row.items() if not k.startswith("_") and k != STEP_METRIC}
            found.setdefault(key, []).append(values)
    return found


def _record_rows(record: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    from kiln.experiments.tracking.wandb_files import record_row_key

    rows = [*record.get("history", []), *record.get("validation_history", [])]
    return {record_row_key(r): {k: v for k, v in r.items() if k != "step"} for r in rows}


def _summary_problems(ref: dict[str, Any], got: dict[str, Any]) -> list[str]:
    return [
        f"summary.json {key}: {got.get(key)!r:.160} != {ref.get(key)!r:.160}"
        for key in ("status", "global_step", "history", "validation_history", "metrics")
        if ref.get(key) != got.get(key)
    ]


def _checkpoint_problems(reference: Path, job_dir: Path, scratch: Path) -> list[str]:
    ref, got = _tensors(reference, scratch), _tensors(job_dir, scratch)
    problems = [f"checkpoints {sorted(got)} != {sorted(ref)}"] if ref.keys() != got.keys() else []
    return problems + [
        f"checkpoint {name}: tensors differ"
        for name in sorted(ref.keys() & got.keys())
        if not _same_tensors(ref[name], got[name])
    ]


def _wandb_problems(job_dir: Path, record: dict[str, Any]) -> list[str]:
    expected = _record_rows(record)
    rows, ids, ended = _wandb_rows(job_dir)
    logged = _wandb_rows_by_key(rows)
    missing = sorted(set(expected) - set(logged))
    twice = sorted(k for k, v in logged.items() if len(v) > 1)
    extra = sorted(set(logged) - set(expected))
    unequal = sorted(k for k, v in logged.items() if k in expected and v[0] != expected[k])
    problems = []
    if missing or twice or extra or unequal:
        problems.append(
            f"W&B rows: missing {missing}, more than once {twice}, extra {extra}, "
            f"values unlike the record's {unequal}"
        )
    if len(ids) != 1:
        problems.append(f"W&B run directories of {len(ids)} run ids: {sorted(ids)}")
    if not ended:
        problems.append("the W&B run has no exit record")
    return problems


def _hydra_problems(reference: Path, job_dir: Path) -> list[str]:
    problems = []
    for name in ("config.yaml", "overrides.yaml"):
        ref_text = (reference / ".hydra" / name).read_text().replace(str(reference), "<job>")
        path = job_dir / ".hydra" / name
        got_text = path.read_text().replace(str(job_dir), "<job>") if path.is_file() else ""
        if ref_text != got_text:
            problems.append(f".hydra/{name} differs from the reference's")
    return problems


def _attempt_problems(job_dir: Path, record: dict[str, Any]) -> list[str]:
    attempts = _json(job_dir / "attempts.json")
    problems = []
    if attempts != record.get("attempts"):
        problems.append("attempts.json differs from summary.json's attempts")
    if not attempts or attempts[-1].get("ended") != "ok":
        problems.append(f"the last attempt did not end ok: {attempts[-1:]}")
    # killed, stopped, or ended ok at the last step but killed while writing its record
    final = record.get("global_step")
    early = [(a.get("ended"), a.get("at_step")) for a in attempts[:-1]]
    if any(end not in ("killed", "SIGTERM") and (end, at) != ("ok", final) for end, at in early):
        problems.append(f"earlier attempts ended {early}")
    return problems


def compare(reference: Path, job_dir: Path, scratch: Path) -> list[str]:
    """What differs between the job's record and the reference's (empty: the same)."""
    if not (job_dir / "summary.json").is_file():
        return ["no summary.json"]
    ref, got = _json(reference / "summary.json"), _json(job_dir / "summary.json")
    return [
        *_summary_problems(ref, got),
        *_checkpoint_problems(reference, job_dir, scratch),
        *_wandb_problems(job_dir, got),
        *_hydra_problems(reference, job_dir),
        *_attempt_problems(job_dir, got),
    ]


# -- the plan -------------------------------------------------------------------------------


def plan(points: list[str], every: bool) -> list[Case]:
    """First and last occurrence of each kind (``every``: each occurrence), SIGKILL; and
    SIGTERM at the last occurrence of each kind (``every``: each)."""
    counts: dict[str, int] = {}
    for kind in points:
        counts[kind] = counts.get(kind, 0) + 1
    cases = []
    for kind, total in counts.items():
        chosen = range(1, total + 1) if every else sorted({1, total})
        cases += [Case(kind, n, total, "SIGKILL") for n in chosen]
        cases += [Case(kind, n, total, "SIGTERM") for n in (chosen if every else [total])]
    return cases


def run_case(case: Case, root: Path, reference: Path) -> Case:
    start = time.perf_counter()
    job_dir = root / re.sub(r"[^A-Za-z0-9_-]+", "_", case.name)
    log = job_dir.parent / f"{job_dir.name}.log"
    code = kill_at(job_dir, log, case.kind, case.occurrence, signal.Signals[case.signal])
    runs = [code]
    for _ in range(2):  # a SIGTERM-stopped job resumes on the first re-run
        runs.append(run_job(job_dir, log))
        if runs[-1] == 0 and _json(job_dir / "summary.json").get("status") == "ok":
            break
    if runs[-1] != 0:
        case.problems.append(f"the re-run exited {runs[-1]} (runs: {runs}); see {log}")
    case.seconds = time.perf_counter() - start
    return case


def judge(case: Case, root: Path, reference: Path) -> None:
    """Compare the case's record with the reference's (after every fork: torch work in this
    process would leave its thread pools to the children)."""
    job_dir = root / re.sub(r"[^A-Za-z0-9_-]+", "_", case.name)
    case.problems += compare(reference, job_dir, root)
    case.verdict = "same as uninterrupted" if not case.problems else "DIFFERS"


def warm_imports() -> None:
    """What every child needs, imported once before the first fork (no torch work)."""
    import lightning  # noqa: F401
    import transformers  # noqa: F401

    import kiln.experiments.jobs.lifecycle
    import kiln.experiments.tracking.wandb_logger
    import kiln.experiments.train.cli
    import kiln.experiments.train.train_job
    import kiln.experiments.train.worker
    import kiln.models  # noqa: F401


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="a new directory for the jobs and results.json")
    parser.add_argument("--every", action="store_true", help="every occurrence of every kind")
    parser.add_argument("--only", default=None, help="only kinds containing this text")
    args = parser.parse_args(argv)
    root: Path = args.out.resolve()
    root.mkdir(parents=True, exist_ok=False)
    start = time.perf_counter()
    warm_imports()
    reference = root / "reference"
    points = record_points(reference, root / "points.txt")
    cases = [c for c in plan(points, args.every) if args.only is None or args.only in c.kind]
    print(f"{len(points)} points of {len(set(points))} kinds in the reference run; "
          f"{len(cases)} cases", flush=True)  # fmt: skip
    for case in cases:
        run_case(case, root, reference)
        print(f"{case.name:<48} ran ({case.seconds:.1f} s)", flush=True)
    for case in cases:
        judge(case, root, reference)
        print(f"{case.name:<48} {case.verdict}", flush=True)
        for problem in case.problems:
            print(f"    {problem}", flush=True)
    total = time.perf_counter() - start
    (root / "results.json").write_text(
        json.dumps(
            {
                "points": points,
                "seconds": total,
                "cases": [{**c.__dict__, "name": c.name} for c in cases],
            },
            indent=1,
        )
    )
    print(_table(cases))
    bad = [c for c in cases if c.problems]
    print(f"{len(cases) - len(bad)} passed, {len(bad)} failed ({total:.0f} s)")
    return 1 if bad else 0


def _table(cases: list[Case]) -> str:
    lines = ["| point | kind | signal | verdict |", "|---|---|---|---|"]
    for case in cases:
        kind = (
            "W&B" if case.kind.startswith("wandb:") else
            "checkpoint" if case.kind.startswith("checkpoints/") else "job file"
        )  # fmt: skip
        point = f"`{case.kind}` {case.occurrence} of {case.of}"
        lines.append(f"| {point} | {kind} | {case.signal} | {case.verdict} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
