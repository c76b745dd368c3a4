"""``kiln-eval <checkpoint | job dir | exported dir>``: evaluate a trained model.

Rebuilds the model and its data module from the run config the checkpoint (or the
``kiln_export.json`` of a kiln-export directory) holds, computes the model's metrics on the
validation split (``--split test`` where the data module has one), writes ``eval.json`` and
logs the metrics to the W&B run the model was trained in (found in the job's
``summary.json``), or to a new run with job type ``eval``. Nothing is written into a job's
directory: ``eval.json`` and the eval's W&B files go to ``--out``'s directory, an export dir,
or ``<job dir>-eval/`` beside the job.

A model that generates (seq2seq) also has its greedy generations scored
(``generated_exact_match``, ``generated_bleu``, ``generated_chrf``) unless ``--no-generate``;
exact match compares each generation with its reference after stripping surrounding
whitespace, case-sensitively.

Examples::

    kiln-eval outputs/runs/2026-11-30_12-00-00   # newest checkpoint -> ..._12-00-00-eval/eval.json
    kiln-eval exported/ --limit-batches 10 --out eval.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kiln.experiments.jobs.fast_exit import end_interrupted
from kiln.experiments.jobs.trained_model import EXPORT_FILE
from kiln.experiments.settings.job_info import TRAIN

EVAL_FILE = "eval.json"


def _job_record(start: Path) -> tuple[Path | None, dict[str, Any]]:
    """The kiln-train job a path belongs to (it or up to two parents hold ``summary.json``)."""
    for directory in [start, *start.parents][:3]:
        if (directory / TRAIN.file).is_file():
            return directory, json.loads((directory / TRAIN.file).read_text())
    return None, {}


def _load(source: Path) -> tuple[Any, dict[str, Any], Path]:
    """The trained module, what it came from, and the path its job is searched from."""
    from kiln.experiments.jobs.trained_model import (
        load_exported_module,
        load_trained_module,
        resolve_checkpoint,
    )

    if (source / EXPORT_FILE).is_file():
        module, record = load_exported_module(source)
        origin = {"export": str(source.resolve()), "checkpoint": record.get("checkpoint")}
        return (
            module,
            {**origin, "global_step": record.get("global_step"), "run_id": record.get("run_id")},
            Path(record.get("checkpoint") or source).parent,
        )
    checkpoint = resolve_checkpoint(source)
    module, meta = load_trained_module(checkpoint)
    origin = {
        "checkpoint": str(checkpoint.resolve()),
        "global_step": meta["global_step"],
        "run_id": meta.get("run_id"),
    }
    return module, origin, checkpoint.parent


OUT_VALID = (
    "give --out a new file, or an earlier kiln-eval result, outside any job directory and "
    "any other model's export"
)


def default_out(source: str | Path, job_dir: Path | None) -> Path:
    """Where ``eval.json`` goes without ``--out``: into the export dir ``source``, else into
    ``<job dir>-eval/`` beside the job ``job_dir`` (``<directory>-eval/`` beside a checkpoint
    directory outside any job), never into the job's own directory."""
    source = Path(source)
    if (source / EXPORT_FILE).is_file():
        return source / EVAL_FILE
    base = (job_dir or (source if source.is_dir() else source.parent)).absolute()
    return base.parent / f"{base.name}-eval" / EVAL_FILE


def check_out(path: Path, run_id: Any) -> None:
    """Refuse an ``eval.json`` path that would write into a job's record, beside another
    model's export, or over a file kiln-eval did not write.

    Raises:
        ValueError: One line naming the path, what is there and what is valid.
    """
    from kiln.experiments.jobs.job_paths import check_not_in_job

    check_not_in_job(path, "--out", OUT_VALID)
    if path.is_dir():
        raise ValueError(f"--out {path} is a directory; {OUT_VALID} (e.g. {path / EVAL_FILE})")
    export_file = path.parent / EXPORT_FILE
    if export_file.is_file():
        try:
            exported = json.loads(export_file.read_text()).get("run_id")
        except (OSError, ValueError, AttributeError):
            exported = None
        if exported is None or exported != run_id:
            raise ValueError(
                f"--out {path} lies in {path.parent}, the export of another model (run "
                f"{exported or '?'}; this is run {run_id}): {OUT_VALID}"
            )
    if path.exists():
        try:
            earlier = json.loads(path.read_text())
        except (OSError, ValueError):
            earlier = None
        if not (isinstance(earlier, dict) and {"metrics", "split"} <= earlier.keys()):
            raise ValueError(f"--out {path} exists and is not a kiln-eval result: {OUT_VALID}")


def run_eval(
    source: str | Path,
    split: str = "validation",
    limit_batches: int | None = None,
    out: str | Path | None = None,
    wandb_mode: str = "offline",
    generate: bool = True,
) -> dict[str, Any]:
    """Evaluate ``source``, write its ``eval.json`` and log to W&B; returns the summary.

    ``eval.json`` (and the eval's W&B files, beside it) goes to ``out``, else into the export
    dir ``source``, else (a job, or a checkpoint) into ``<job dir>-eval/`` beside the job
    (:func:`default_out`). Nothing is written into a job's directory. ``generate=False``
    skips a generating model's generation metrics.

    Raises:
        ValueError: ``limit_batches`` is below 1, or ``out`` is refused (:func:`check_out`).
    """
    from kiln.core.atomic import atomic_write
    from kiln.experiments.eval.evaluate import check_limit_batches, evaluate
    from kiln.experiments.jobs.job_paths import check_not_in_job

    check_limit_batches(limit_batches)  # before the model is loaded
    source = Path(source)
    if out is not None:  # before the model is loaded
        check_not_in_job(Path(out), "--out", OUT_VALID)
    module, origin, search_from = _load(source)
    job_dir, record = _job_record(search_from)
    path = Path(out) if out is not None else default_out(source, job_dir)
    check_out(path, origin.get("run_id"))  # before the metrics are computed
    metrics = evaluate(module, split, limit_batches, generate=generate)
    summary: dict[str, Any] = {
        "split": split,
        "limit_batches": limit_batches,
        "generate": generate,
        "metrics": metrics,
        "model": (record.get("config") or {}).get("model"),
        "job_dir": str(job_dir) if job_dir else None,
        **origin,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    summary["wandb"] = _log(summary, record.get("wandb") or {}, path.parent, wandb_mode)
    atomic_write(path, json.dumps(summary, indent=2, default=str) + "\n")
    summary["file"] = str(path)
    return summary


def _log(
    summary: dict[str, Any], trained_in: dict[str, Any], where: Path, mode: str
) -> dict[str, Any] | None:
    """Log the metrics to the run the model was trained in (or a new ``eval`` run); the
    run's files go to ``where`` (beside ``eval.json``), never into the job's directory."""
    if mode == "disabled":
        return None
    from kiln.experiments.settings.base import LoggerConfig
    from kiln.experiments.settings.job_info import JobInfo
    from kiln.experiments.tracking.tracker import Tracker

    cfg = LoggerConfig(
        backend="wandb",
        mode=mode,
        project=trained_in.get("project") or "kiln",
        group=trained_in.get("group"),
        job_type="eval",
    )
    job = JobInfo(output_dir=str(where), job_name="eval")
    with Tracker(
        cfg, job, config={"eval": summary}, name="eval", run_id=trained_in.get("run_id")
    ) as t:
        t.summarize({f"eval/{k}": v for k, v in summary["metrics"].items()})
        return t.info


def main(argv: list[str] | None = None) -> None:
    """Console script entry point."""
    parser = argparse.ArgumentParser(prog="kiln-eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="a checkpoint, kiln-train job dir or kiln-export dir")
    parser.add_argument("--split", default="validation", help="validation (default) or test")
    parser.add_argument(
        "--limit-batches", type=int, default=None, help="first N batches only (N >= 1)"
    )
    parser.add_argument(
        "--generate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="score a generating (seq2seq) model's greedy generations too: generated_"
        "exact_match (whitespace-stripped, case-sensitive), generated_bleu, generated_chrf "
        "(default: on)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help=f"where to write {EVAL_FILE} (default: into the export dir, else <job dir>-eval/ "
        "beside the job; never into a job directory)",
    )
    parser.add_argument(
        "--wandb-mode", default="offline", choices=["offline", "online", "disabled"]
    )
    args = parser.parse_args(argv)
    try:
        summary = run_eval(
            args.source,
            args.split,
            args.limit_batches,
            args.out,
            args.wandb_mode,
            generate=args.generate,
        )
    except KeyboardInterrupt as interrupt:
        end_interrupted(interrupt)
    except (FileNotFoundError, ValueError, NotImplementedError) as err:
        print(f"kiln-eval: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    for name, value in summary["metrics"].items():
        print(f"{name}: {value:.6g}")
    print(f"wrote {summary['file']}")


if __name__ == "__main__":
    main()
