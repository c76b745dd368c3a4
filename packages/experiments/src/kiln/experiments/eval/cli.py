"""``kiln-eval <checkpoint | job dir | exported dir>``: evaluate a trained model.

Rebuilds the model and its data module from the run config the checkpoint (or the
``kiln_export.json`` of a kiln-export directory) holds, computes the model's metrics on the
validation split (``--split test`` where the data module has one), writes ``eval.json`` and
logs the metrics to the W&B run the model was trained in (found in the job's
``summary.json``), or to a new run with job type ``eval``.

A model that generates (seq2seq) also has its greedy generations scored
(``generated_exact_match``, ``generated_bleu``, ``generated_chrf``) unless ``--no-generate``;
exact match compares each generation with its reference after stripping surrounding
whitespace, case-sensitively.

Examples::

    kiln-eval outputs/runs/2026-11-30_12-00-00                # the job's newest checkpoint
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
            {**origin, "global_step": record.get("global_step")},
            Path(record.get("checkpoint") or source).parent,
        )
    checkpoint = resolve_checkpoint(source)
    module, meta = load_trained_module(checkpoint)
    origin = {"checkpoint": str(checkpoint.resolve()), "global_step": meta["global_step"]}
    return module, origin, checkpoint.parent


def run_eval(
    source: str | Path,
    split: str = "validation",
    limit_batches: int | None = None,
    out: str | Path | None = None,
    wandb_mode: str = "offline",
    generate: bool = True,
) -> dict[str, Any]:
    """Evaluate ``source``, write its ``eval.json`` and log to W&B; returns the summary.

    ``eval.json`` goes to ``out``, else into ``source`` (a job, checkpoint or export dir), else
    (a checkpoint file) into its job dir, else beside it. ``generate=False`` skips a
    generating model's generation metrics.

    Raises:
        ValueError: ``limit_batches`` is below 1.
    """
    from kiln.experiments.eval.evaluate import check_limit_batches, evaluate

    check_limit_batches(limit_batches)  # before the model is loaded
    source = Path(source)
    module, origin, search_from = _load(source)
    metrics = evaluate(module, split, limit_batches, generate=generate)
    job_dir, record = _job_record(search_from)
    summary: dict[str, Any] = {
        "split": split,
        "limit_batches": limit_batches,
        "generate": generate,
        "metrics": metrics,
        "model": (record.get("config") or {}).get("model"),
        "job_dir": str(job_dir) if job_dir else None,
        **origin,
    }
    summary["wandb"] = _log(summary, record.get("wandb") or {}, job_dir, wandb_mode)
    default_dir = source if source.is_dir() else (job_dir or source.parent)
    path = Path(out) if out is not None else default_dir / EVAL_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    summary["file"] = str(path)
    return summary


def _log(
    summary: dict[str, Any], trained_in: dict[str, Any], job_dir: Path | None, mode: str
) -> dict[str, Any] | None:
    """Log the metrics to the run the model was trained in (or a new ``eval`` run)."""
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
    where = job_dir or Path(summary.get("export") or summary["checkpoint"]).parent
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
    parser.add_argument("--out", default=None, help=f"where to write {EVAL_FILE}")
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
