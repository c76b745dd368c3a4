"""The stub table of issue 45: which tests fail when one guarantee of kiln is switched off.

Each stub is a minimal, exact source edit that turns one feature off while kiln still imports
and runs (the document mask becomes a plain causal mask, the stop poll never sees a stop, ...).
For each stub the script copies a commit of ``--tree`` (``--rev``, HEAD by default; never
uncommitted changes) into a scratch directory (``git archive``), applies the stub there,
checks that the edited module is imported from that copy, runs the stub's test modules with
pytest and records the tests that failed or errored. The un-stubbed commit runs once over all
the selected modules too: a test failing there is a pre-existing failure, not a catch. An edit
whose old text does not occur exactly once fails loudly (a stale stub would prove nothing).

    flock /tmp/kiln-heavy.lock .venv/bin/python scripts/stub_check.py \\
        --tree . --out /tmp/stubs/before-fast.json [--rev REV] [--stub NAME ...] [--marker EXPR]

``--marker`` defaults to the fast tier (``make test``); ``--marker "not slow and not gpu and
not process and not slurm"`` adds the in-process ``long`` cases. Prints the table
(stub | file edited | what it turns off | tests failing) and writes it as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path

FAST = "not slow and not gpu and not process and not slurm and not long"
SRC_DIRS = ("packages/core/src", "packages/models/src", "packages/experiments/src")
RUN_TIMEOUT_S = 30 * 60  # one pytest run; a stub that hangs a test is recorded as timed out

CORE = "packages/core/src/kiln/core"
MODELS = "packages/models/src/kiln/models"
EXP = "packages/experiments/src/kiln/experiments"


@dataclass(frozen=True)
class Stub:
    name: str
    turns_off: str
    tests: tuple[str, ...]  # the test modules that exercise the feature
    file: str
    edits: tuple[tuple[str, str], ...]  # (exact old text, new text) in file


STUBS = (
    Stub(
        "document_mask",
        "packed rows get a plain causal mask, not the block-diagonal document mask",
        ("tests/models/test_packing.py",),
        f"{MODELS}/data/packing.py",
        (
            (
                "allowed = (document_ids[:, :, None] == document_ids[:, None, :]) & causal",
                "allowed = causal.expand(document_ids.shape[0], length, length)  # stub",
            ),
        ),
    ),
    Stub(
        "token_weighting",
        "token-weighted LM losses weigh every micro-batch alike (num_items = 1)",
        ("tests/models/test_float64.py", "tests/models/test_tokens.py"),
        f"{MODELS}/tokens.py",
        (
            (
                "return nll.sum() / count.clamp(min=1), count",
                "return nll.sum() / count.clamp(min=1), torch.ones_like(count)  # stub",
            ),
            (
                "return (labels != IGNORE_INDEX).sum()",
                "return torch.ones((), dtype=torch.long)  # stub",
            ),
        ),
    ),
    Stub(
        "stream_state",
        "a checkpoint's stream position is not restored on resume",
        ("tests/core/test_stream.py", "tests/experiments/test_train_streaming.py"),
        f"{CORE}/loop/stream.py",
        (
            (
                "restore_stream(self.fabric, self.loader, {STATE_KEY: state}, self.path)",
                "del state  # stub",
            ),
        ),
    ),
    Stub(
        "threads_per_rank",
        "trainer.threads_per_rank does not set torch's intra-op threads",
        (
            "tests/core/test_threads.py",
            "tests/experiments/test_train_threads.py",
            "tests/experiments/test_threads_across_launchers.py",
        ),
        f"{CORE}/distributed/threads.py",
        (("torch.set_num_threads(threads)", "pass  # stub"),),
    ),
    Stub(
        "stop_poll",
        "the stop poll at a step boundary never sees a stop request",
        ("tests/core/test_stop.py", "tests/experiments/test_signals_every_phase.py"),
        f"{CORE}/distributed/stop.py",
        (("self() if self.total_steps is None or step < self.total_steps else 0", "0  # stub"),),
    ),
    Stub(
        "data_fingerprint",
        "the data fingerprint is constant (no files, no splits)",
        ("tests/models/test_data_fingerprint.py", "tests/experiments/test_data_identity.py"),
        f"{MODELS}/data/fingerprint.py",
        (
            (
                'return {"version": VERSION, "files": files, "splits": splits}',
                'return {"version": VERSION, "files": {}, "splits": {}}  # stub',
            ),
        ),
    ),
    Stub(
        "callback_state",
        "no stateful callback's state is saved in a checkpoint",
        ("tests/core/test_callbacks.py", "tests/core/test_checkpoint_registry.py"),
        f"{CORE}/callback_points.py",
        (
            (
                "return {key: callback.state_dict() for key, callback in self.stateful.items()}",
                "return {}  # stub",
            ),
        ),
    ),
    Stub(
        "default_packing_policy",
        "the map-style default packing policy is whole instead of best_fit",
        ("tests/models/test_packing.py",),
        f"{MODELS}/data/packing.py",
        (('DEFAULT_POLICY = "best_fit"', 'DEFAULT_POLICY = "whole"  # stub'),),
    ),
    Stub(
        "validation_bound",
        "data.max_val_tokens is ignored: validation takes every validation document",
        ("tests/models/test_packing.py", "tests/experiments/test_corpus.py"),
        f"{MODELS}/data/text.py",
        (("self.max_val_tokens = max_val_tokens", "self.max_val_tokens = None  # stub"),),
    ),
    Stub(
        "preempt_mode",
        "preempt_requeue=auto does not read the partition's PreemptMode (always requeues)",
        (
            "tests/experiments/test_launchers.py",
            "tests/experiments/test_requeue_reason.py",
            "tests/experiments/test_slurm_multinode.py",
            "tests/experiments/test_slurm_records.py",
        ),
        f"{EXP}/launchers/slurm.py",
        (('cancels = "CANCEL" in mode.upper().split(",")', "cancels = False  # stub"),),
    ),
    Stub(
        "accumulation_scaling",
        "each micro-batch's mean loss is backpropagated unscaled (no n * world / total)",
        ("tests/core/test_accumulation.py",),
        f"{CORE}/loop/step.py",
        (
            ("return loss if weight == 1.0 else loss * weight", "return loss  # stub"),
            ("return loss * weight.to(loss.dtype)", "return loss  # stub"),
        ),
    ),
    Stub(
        "rng_restore",
        "a resumed run does not restore the checkpoint's random streams",
        ("tests/core/test_checkpoint.py", "tests/core/test_resume.py"),
        f"{CORE}/loop/fit.py",
        (("restore_rng_state(resume_rng)", "pass  # stub"),),
    ),
    Stub(
        "wandb_repair",
        "a skipped re-run of a finished job does not repair its W&B run (_repair_run)",
        ("tests/experiments/test_records_wandb_end.py",),
        f"{EXP}/train/train_job.py",
        (("_repair_run(done, job)", "pass  # stub"),),
    ),
    Stub(
        "refused_writes_nothing",
        "every run owns its job directory from its start (refused runs write there)",
        ("tests/experiments/test_records_owner.py", "tests/experiments/test_records_refused.py"),
        f"{EXP}/settings/job_files.py",
        (("_state[key] = _OWNED if owned else _WAITING", "_state[key] = _OWNED  # stub"),),
    ),
    Stub(
        "dropped_callback_state",
        "callback state no callback takes is not reported (no StateChangedError)",
        (
            "tests/core/test_callbacks.py",
            "tests/core/test_checkpoint_registry.py",
            "tests/experiments/test_checkpoint_state.py",
        ),
        f"{CORE}/callback_points.py",
        (
            (
                'self.dropped = [f"callbacks/{key}" for key in state if key not in self.stateful]',
                "self.dropped = []  # stub",
            ),
        ),
    ),
)


def scratch_copy(tree: Path, commit: str) -> Path:
    """``commit`` of ``tree`` in a new directory, with ``tree``'s venv linked in."""
    root = Path(tempfile.mkdtemp(prefix="stubtree-"))
    archive = subprocess.run(
        ["git", "-C", str(tree), "archive", commit], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    (root / ".venv").symlink_to(tree / ".venv")
    return root


def apply(root: Path, stub: Stub) -> None:
    path = root / stub.file
    text = path.read_text()
    for old, new in stub.edits:
        if text.count(old) != 1:
            raise SystemExit(f"stub {stub.name}: {stub.file} holds {old!r} {text.count(old)} times")
        text = text.replace(old, new)
    path.write_text(text)


def environment(root: Path) -> dict[str, str]:
    """Where the copy's packages come first: before the venv's editable installs."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(str(root / d) for d in SRC_DIRS)}


def module_name(file: str) -> str:
    src = next(d for d in SRC_DIRS if file.startswith(d + "/"))
    return file[len(src) + 1 : -len(".py")].removesuffix("/__init__").replace("/", ".")


def check_imports(root: Path, file: str) -> str:
    """Import the edited module as the tests will; fail unless it is the copy's ``file``."""
    name = module_name(file)
    path = subprocess.run(
        [str(root / ".venv/bin/python"), "-c", f"import {name}; print({name}.__file__)"],
        env=environment(root),
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if Path(path).resolve() != (root / file).resolve():
        raise SystemExit(f"{name} was imported from {path}, not from the copy {root}")
    return path


def outcomes(xml: Path) -> tuple[dict[str, str], dict[str, str]]:
    """JUnit XML (xunit1) as ``{node id: passed | failed | skipped}``, and the failures'
    messages by node id."""
    results: dict[str, str] = {}
    messages: dict[str, str] = {}
    for case in ET.parse(xml).iter("testcase"):
        file, classname = case.get("file") or "", case.get("classname") or ""
        module = file.removesuffix(".py").replace("/", ".")
        inner = classname[len(module) + 1 :] if classname.startswith(module + ".") else ""
        node = "::".join(p for p in (file, inner, case.get("name", "")) if p)
        problems = [c for c in case if c.tag in ("failure", "error")]
        if problems:
            messages.setdefault(node, (problems[0].get("message") or problems[0].tag)[:500])
        skipped = case.find("skipped") is not None
        results[node] = "failed" if node in messages else "skipped" if skipped else "passed"
    return results, messages


def run_tests(root: Path, tests: list[str], marker: str) -> dict:
    xml = root / "stub-check.xml"
    options = ["-p", "no:cacheprovider", "-q", "--durations=5", "-o", "junit_family=xunit1"]
    cmd = [str(root / ".venv/bin/pytest"), *options, f"--junitxml={xml}", "-m", marker, *tests]
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd,
            cwd=root,
            env=environment(root),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
        returncode, tail = proc.returncode, (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired:
        returncode, tail = "timed out", f"pytest ran past {RUN_TIMEOUT_S} s"
    seconds = round(time.perf_counter() - started, 1)
    results, messages = outcomes(xml) if xml.exists() else ({}, {})
    counts = {k: sum(v == k for v in results.values()) for k in ("passed", "failed", "skipped")}
    failed = {node: messages[node] for node in sorted(messages)}  # node id: its message
    return {
        "returncode": returncode,
        "seconds": seconds,
        "counts": counts,
        "failed": failed,
        "output_tail": tail,
    }


def run_in_copy(tree: Path, commit: str, stub: Stub | None, tests: list[str], marker: str) -> dict:
    root = scratch_copy(tree, commit)
    try:
        if stub is not None:
            apply(root, stub)
        imported = check_imports(root, stub.file if stub else f"{CORE}/__init__.py")
        return {**run_tests(root, tests, marker), "imported_from": imported}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def print_table(rows: list[dict]) -> None:
    print("\nstub | file edited | what it turns off | tests failing")
    for row in rows:
        note = f" (+{len(row['pre_existing'])} failing un-stubbed)" if row["pre_existing"] else ""
        note += "" if row["returncode"] in (0, 1) else f" (pytest: {row['returncode']})"
        file = row["file"].split("/src/")[-1]
        print(f"{row['name']} | {file} | {row['turns_off']} | {len(row['caught'])}{note}")
        for node in row["caught"]:
            print(f"    {node}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, required=True, help="a git checkout of kiln")
    parser.add_argument("--out", type=Path, required=True, help="the JSON to write")
    parser.add_argument("--rev", default="HEAD", help="the commit of the tree to check")
    parser.add_argument("--stub", action="append", choices=[s.name for s in STUBS])
    parser.add_argument("--marker", default=FAST, help="pytest -m expression")
    args = parser.parse_args()
    tree, started = args.tree.resolve(), time.perf_counter()
    stubs = [s for s in STUBS if not args.stub or s.name in args.stub]
    every_test = sorted({t for s in stubs for t in s.tests})
    head = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", args.rev], capture_output=True, text=True, check=True
    ).stdout.strip()
    print(f"{args.rev} {head}; marker {args.marker!r}; un-stubbed run of {len(every_test)} modules")
    baseline = run_in_copy(tree, head, None, every_test, args.marker)
    print(f"  {baseline['counts']} in {baseline['seconds']} s", flush=True)
    rows = []
    for stub in stubs:
        print(f"stub {stub.name}: {' '.join(stub.tests)}", flush=True)
        result = run_in_copy(tree, head, stub, list(stub.tests), args.marker)
        before = set(baseline["failed"])
        caught = {n: m for n, m in result["failed"].items() if n not in before}
        pre_existing = [n for n in result["failed"] if n in before]
        rows.append({**asdict(stub), **result, "caught": caught, "pre_existing": pre_existing})
        print(f"  {result['counts']} in {result['seconds']} s", flush=True)
    print_table(rows)
    seconds = round(time.perf_counter() - started, 1)
    print(f"\n{len(rows)} stubs in {seconds} s; failing un-stubbed: {list(baseline['failed'])}")
    report = {
        "tree": str(tree),
        "head": head,
        "marker": args.marker,
        "seconds": seconds,
        "python": sys.version.split()[0],
        "baseline": {"tests": every_test, **baseline},
        "stubs": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
