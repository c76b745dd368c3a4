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

from kiln.experiments.jobs.fast_exit import end_interrupted
from kiln.experiments.jobs.trained_model import EXPORT_FILE


def export(source: str | Path, out_dir: str | Path) -> Path:
    """Export the model of ``source`` (checkpoint, checkpoint dir or job dir) to ``out_dir``.

    Returns:
        ``out_dir``.
    """
    from kiln.experiments.jobs.trained_model import (  # torch: lazy
        load_trained_module,
        resolve_checkpoint,
    )

    checkpoint = resolve_checkpoint(source)
    module, meta = load_trained_module(checkpoint)
    out = Path(module.export(out_dir))
    record = {
        "checkpoint": str(checkpoint.resolve()),
        "global_step": meta["global_step"],
        "run_id": meta["run_id"],
        "model": meta["config"]["model"],
        "task": module.task,
        "config": meta["config"],  # rebuilds the wrapper and its data (kiln-eval)
    }
    (out / EXPORT_FILE).write_text(json.dumps(record, indent=2, default=str) + "\n")
    return out


def main(argv: list[str] | None = None) -> None:
    """Console script entry point."""
    parser = argparse.ArgumentParser(prog="kiln-export", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="a checkpoint file, checkpoint dir or kiln-train job dir")
    parser.add_argument("out_dir", help="the directory to write (created)")
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
