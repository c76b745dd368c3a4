"""Helpers for the kiln-export tests: run kiln's commands, load exports with plain libraries."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from in_process import kiln_command

# Runs in a fresh interpreter: loads each export with plain transformers / timm only and
# writes its outputs on the inputs the kiln module saw.
PLAIN_LOADER = """
import json, sys, torch
cases = torch.load(sys.argv[1])
outputs = {}
for name, case in cases.items():
    out = case["dir"]
    if case["library"] == "timm":
        import timm
        model = timm.create_model("local-dir:" + out, pretrained=True).eval()
        with torch.no_grad():
            outputs[name] = model(case["inputs"]["pixel_values"])
    else:
        import transformers
        auto = getattr(transformers, case["auto_class"])
        model = auto.from_pretrained(out).eval()
        tokenizer = transformers.AutoTokenizer.from_pretrained(out)
        assert len(tokenizer) == model.get_input_embeddings().num_embeddings
        with torch.no_grad():
            outputs[name] = model(**case["inputs"]).logits
assert not [m for m in sys.modules if m == "kiln" or m.startswith("kiln.")], "imported kiln"
torch.save(outputs, sys.argv[2])
"""


def kiln(command: str, *args: object, env: dict[str, str] | None = None, process: bool = False):
    """``kiln-<command> args`` (``env``: extra variables): in this process, or with
    ``process=True`` in a fresh interpreter (see :func:`in_process.kiln_command`)."""
    return kiln_command(command, list(map(str, args)), env, process=process)


def export_case(module: Any, out: Path) -> tuple[dict[str, Any], torch.Tensor]:
    """What PLAIN_LOADER needs to run the export in ``out`` on ``module``'s example batch,
    and the outputs the kiln module gives on it."""
    batch = module.example_batch(2)
    with torch.no_grad():
        if module.task == "image-classification":
            library, inputs = "timm", {"pixel_values": batch["pixel_values"]}
            expected = module(batch["pixel_values"])
        else:
            library, inputs = "transformers", module.model_inputs(batch)
            expected = module(**inputs).logits
    auto_class = getattr(module, "auto_class_name", "")
    case = {"dir": str(out), "library": library, "auto_class": auto_class, "inputs": inputs}
    return case, expected


def plain_outputs(cases: dict[str, dict[str, Any]], tmp_path: Path) -> dict[str, torch.Tensor]:
    """Each case's outputs from a fresh interpreter that loads the exports with plain
    timm / transformers and never imports kiln (no PYTHONPATH either)."""
    torch.save(cases, tmp_path / "cases.pt")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", PLAIN_LOADER, str(tmp_path / "cases.pt"), str(tmp_path / "out.pt")],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-6000:]
    return torch.load(tmp_path / "out.pt")
