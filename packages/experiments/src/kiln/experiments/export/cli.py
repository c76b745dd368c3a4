"""``kiln-export <checkpoint or job dir> <out dir>``: write a trained model for plain HF / timm.

HF models become a ``save_pretrained`` directory with their tokenizer
(``AutoModelFor*.from_pretrained(out)``); timm models become ``model.safetensors`` and a
``config.json`` of their ``timm.create_model`` arguments and data config
(``timm.create_model("local-dir:<out>", pretrained=True)``).

Examples::

    kiln-export outputs/runs/2026-11-30_12-00-00 exported/   # the job's newest checkpoint
    kiln-export checkpoints/step-00000100.ckpt exported/
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kiln.experiments.eval.cli import EVAL_FILE
from kiln.experiments.jobs.fast_exit import end_interrupted
from kiln.experiments.jobs.trained_model import EXPORT_FILE


def export(source: str | Path, out_dir: str | Path) -> Path:
    """Export the model of ``source`` (checkpoint, checkpoint dir or job dir) to ``out_dir``.

    ``out_dir`` must be new, empty, or hold an earlier export of this same job (which is
    replaced whole); it may not be or lie inside a kiln job directory. The export is written
    into a new directory beside ``out_dir`` and renamed into place: ``out_dir`` never holds
    two models' files.

    Returns:
        ``out_dir``.

    Raises:
        ValueError: ``out_dir`` is refused; the message names it and what is valid.
    """
    import shutil

    from kiln.core import read_checkpoint_meta
    from kiln.experiments.jobs.job_paths import check_export_dir, replace_dir, staging_dir
    from kiln.experiments.jobs.trained_model import (  # torch: lazy
        load_trained_module,
        resolve_checkpoint,
    )

    out = Path(out_dir)
    checkpoint = resolve_checkpoint(source)
    meta = read_checkpoint_meta(checkpoint)  # before the model is built: refuse early
    model = (meta.get("config") or {}).get("model")
    check_export_dir(out, EXPORT_FILE, meta["run_id"], model, results=(EVAL_FILE, "wandb/"))
    module, meta = load_trained_module(checkpoint)
    staging = staging_dir(out)
    try:
        module.export(staging)
        files = sorted(str(p.relative_to(staging)) for p in staging.rglob("*") if p.is_file())
        record = {
            "checkpoint": str(checkpoint.resolve()),
            "global_step": meta["global_step"],
            "run_id": meta["run_id"],
            "model": meta["config"]["model"],
            "task": module.task,
            "config": meta["config"],  # rebuilds the wrapper and its data (kiln-eval)
            "files": files,  # what this export wrote: a re-export replaces only these
        }
        (staging / EXPORT_FILE).write_text(json.dumps(record, indent=2, default=str) + "\n")
        replace_dir(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> None:
    """Console script entry point."""
    parser = argparse.ArgumentParser(prog="kiln-export", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="a checkpoint file, checkpoint dir or kiln-train job dir")
    parser.add_argument(
        "out_dir",
        help="the directory to write: new, empty, or an earlier export of this same job "
        "(replaced); never in a job directory",
    )
    args = parser.parse_args(argv)
    try:
        out = export(args.source, args.out_dir)
    except KeyboardInterrupt as interrupt:
        end_interrupted(interrupt)
    except (FileNotFoundError, ValueError, NotImplementedError) as err:
        print(f"kiln-export: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"exported to {out}")


if __name__ == "__main__":
    main()
