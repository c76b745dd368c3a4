"""Read an offline W&B run back from its ``.wandb`` files, without uploading it.

The reading is W&B's own: ``wandb leet inspect --json`` prints every record of a run's
transaction log as one JSON object per line, and refuses a format version it does not know.
This module finds a run's files (a resumed job continues its run in one file per attempt)
and folds the records into history rows, the summary and the run's fields: enough to find
the last step a run holds (a resumed job backfills exactly the steps after it), to check that
every logged step is there, or to look at an offline run before ``wandb sync``.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


class WandbFormatError(ValueError):
    """A ``.wandb`` file the installed wandb cannot read (not a W&B transaction log, or a
    format version of a newer wandb): the message holds wandb's own words."""


def find_run_file(path: str | Path) -> Path:
    """The ``.wandb`` file of a run directory (or of the only run below ``path``).

    Raises:
        FileNotFoundError: ``path`` holds no ``.wandb`` file, or several (a resumed job's
            attempts: read them all with :func:`find_run_files`).
    """
    files = find_run_files(path)
    if len(files) != 1:
        raise FileNotFoundError(f"expected exactly one .wandb file under {path}, found {files}")
    return files[0]


def find_run_files(path: str | Path) -> list[Path]:
    """The ``.wandb`` files of the one run at ``path``, oldest attempt first.

    A job re-run into its directory continues its W&B run, and each attempt writes its own
    ``offline-run-<time>-<id>/run-<id>.wandb``: together they are the run. ``path`` is a
    ``.wandb`` file, a run directory or a job directory.

    Raises:
        FileNotFoundError: No ``.wandb`` file below ``path``.
        ValueError: The files belong to more than one run (e.g. a sweep directory).
    """
    path = Path(path)
    if path.is_file():
        return [path]
    found = {f.resolve(): f for f in path.rglob("*.wandb")}  # latest-run links to one of them
    files = sorted(found.values(), key=lambda f: (f.parent.name, f.stat().st_mtime))
    if not files:
        raise FileNotFoundError(f"no .wandb file under {path}")
    ids = sorted({f.stem.removeprefix("run-") for f in files})
    if len(ids) > 1:
        raise ValueError(
            f"{path} holds {len(ids)} W&B runs ({', '.join(ids)}); give one job's or run's "
            "directory"
        )
    return files


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a run as W&B prints it (``{"type": ..., <type>: {...}}``), in order:
    of its ``.wandb`` file, or of every attempt's file of a resumed job
    (:func:`find_run_files`). An attempt that was killed may end in a half-written record;
    the records before it count, as for W&B's own sync."""
    records: list[dict[str, Any]] = []
    for file in find_run_files(path):
        stat = file.stat()
        records.extend(_inspect(file.resolve(), stat.st_size, stat.st_mtime_ns))
    return records


@functools.lru_cache(maxsize=64)
def _inspect(file: Path, size: int, mtime_ns: int) -> tuple[dict[str, Any], ...]:
    """``wandb leet inspect --json`` of one file; cached while the file is unchanged (a test
    reads one run's history, summary and fields in turn)."""
    del size, mtime_ns  # the cache key: a file still being written is read again
    # a reader of files: never attached to this process's W&B service (its log would grow)
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"} | {"WANDB_SILENT": "true"}
    done = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(file)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        import wandb

        raise WandbFormatError(
            f"wandb {wandb.__version__} cannot read {file}: {done.stderr.strip()}"
        )
    return tuple(json.loads(line) for line in done.stdout.splitlines() if line.startswith("{"))


def read_history(path: str | Path) -> list[dict[str, Any]]:
    """The run's history: one dict per ``log`` call (``_step`` plus the logged values), over
    every attempt of a resumed job."""
    return [r["history"].get("item", {}) for r in read_records(path) if r["type"] == "history"]


def last_logged_step(files: list[Path], step_key: str) -> int | None:
    """The highest ``step_key`` in the rows of ``files`` (a killed run's file may end in a
    half-written record: the rows before it count), or ``None`` when there is none.

    Raises:
        WandbFormatError: A file the installed wandb cannot read (guessing would log steps
            twice, or not at all).
    """
    steps = [
        row[step_key]
        for file in files
        for row in read_history(file)
        if isinstance(row.get(step_key), int | float)
    ]
    return int(max(steps)) if steps else None


ROW_KINDS = {"val/": "validation", "test/": "test"}
"""A logged row's kind by its keys' prefix; any other row is a ``train`` row."""


def row_kind(row: Any) -> str:
    """``train``, ``validation`` or ``test``: which of a job's series a logged row belongs
    to (each is logged apart, so a killed attempt may have sent one and not the other)."""
    for prefix, kind in ROW_KINDS.items():
        if any(str(key).startswith(prefix) for key in row):
            return kind
    return "train"


def run_files(job_dir: str | Path, run_id: str) -> list[Path]:
    """The ``.wandb`` files of the W&B run ``run_id`` in a job directory, one per attempt
    (``wandb/(offline-)run-<time>-<id>/run-<id>.wandb``), oldest first; none: ``[]``."""
    pattern = f"wandb/*run-*-{run_id}/run-{run_id}.wandb"
    return sorted(Path(job_dir).glob(pattern))


def row_key(row: dict[str, Any], step_key: str) -> tuple[str, int] | None:
    """``(kind, step)`` of a logged row (:func:`row_kind`; ``step`` its ``step_key``), or
    ``None`` for a row without a step: what one job logs once per step and kind."""
    step = row.get(step_key)
    if not isinstance(step, int | float):
        return None
    return row_kind(k for k in row if k != step_key and not k.startswith("_")), int(step)


def record_row_key(row: dict[str, Any]) -> tuple[str, int]:
    """``(kind, step)`` of a row of a job's own history (``{"step": N, <metric>: value}``,
    as ``summary.json`` and a checkpoint hold it): the key of :func:`row_key`."""
    return row_kind(k for k in row if k != "step"), int(row["step"])


def logged_rows(files: list[Path], step_key: str) -> set[tuple[str, int]]:
    """The ``(kind, step)`` of every row in ``files`` (:func:`row_key`).

    Raises:
        WandbFormatError: A file the installed wandb cannot read.
    """
    keys = (row_key(row, step_key) for file in files for row in read_history(file))
    return {key for key in keys if key is not None}


def last_logged_steps(files: list[Path], step_key: str) -> dict[str, int]:
    """The highest ``step_key`` of each kind of row (:func:`row_kind`) in ``files``; a kind
    with no row is left out.

    Raises:
        WandbFormatError: A file the installed wandb cannot read.
    """
    through: dict[str, int] = {}
    for kind, step in logged_rows(files, step_key):
        through[kind] = max(through.get(kind, step), step)
    return through


def has_exit(files: list[Path]) -> bool:
    """Whether the run ends (its last attempt's file holds an exit record): a run killed
    before its end has none, and W&B shows it as still running.

    Raises:
        WandbFormatError: A file the installed wandb cannot read.
    """
    return bool(files) and any(r["type"] == "exit" for r in read_records(files[-1]))


def read_summary(path: str | Path) -> dict[str, Any]:
    """The run's final summary (the last value of every key written to it)."""
    summary: dict[str, Any] = {}
    for record in read_records(path):
        if record["type"] == "summary":
            summary.update(record["summary"].get("update", {}))
            for key in record["summary"].get("remove", {}):
                summary.pop(key, None)
    return summary


def read_run(path: str | Path) -> dict[str, Any]:
    """Name, group, job type, tags, config (with later updates) and exit code of the run."""
    info: dict[str, Any] = {}
    for record in read_records(path):
        kind = record["type"]
        if kind == "run":
            run = record["run"]
            info.update(
                id=run.get("run_id", ""),
                name=run.get("display_name", ""),
                group=run.get("run_group", ""),
                job_type=run.get("job_type", ""),
                tags=list(run.get("tags", [])),
                project=run.get("project", ""),
            )
            info.setdefault("config", {}).update(run.get("config", {}).get("update", {}))
        elif kind == "config":  # config.update() after the run started
            info.setdefault("config", {}).update(record["config"].get("update", {}))
        elif kind == "exit":
            info["exit_code"] = record["exit"].get("exit_code", 0)
    return info


def main(argv: list[str] | None = None) -> None:
    """``python -m kiln.experiments.tracking.wandb_files <run or job dir>``: print a run (all
    attempts of a resumed job's run as one)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("path", help="an offline-run-* directory, a job directory or a .wandb file")
    parser.add_argument("--history", action="store_true", help="print every logged row")
    args = parser.parse_args(argv)
    info = read_run(args.path)
    info["attempts"] = len(find_run_files(args.path))  # a resumed job's files, read as one
    print(json.dumps({k: v for k, v in info.items() if k != "config"}, indent=2))
    summary = {k: v for k, v in read_summary(args.path).items() if not k.startswith("_")}
    print(json.dumps(summary, indent=2))
    if args.history:
        for row in read_history(args.path):
            print(json.dumps({k: v for k, v in row.items() if not k.startswith("_")}))


if __name__ == "__main__":
    main()
