"""``kiln-train trainer.precision_audit=true`` audits the job's first step and records which
ops ran in which dtype, and where, in its ``summary.json`` (``telemetry.precision_audit``)."""

from __future__ import annotations

from train_helpers import FAST, job_dirs, run_train, summary

import kiln.models.hf

LLAMA = ["experiment=tiny_llama_lm", *FAST, "trainer.max_steps=1", "compile=none"]


def test_a_64_true_job_records_every_op_below_float64_and_where(tmp_path, monkeypatch) -> None:
    # transformers' own Llama, whose RMSNorm computes in float32 (kiln.models' override off)
    monkeypatch.setattr(kiln.models.hf, "compute_in_input_dtype", lambda model: [])
    args = [*LLAMA, "precision=64-true", "trainer.precision_audit=true"]
    proc = run_train(args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    job = job_dirs(tmp_path)[0]
    record = summary(job)["telemetry"]["precision_audit"]
    assert record["precision"] == "64-true"
    assert record["ops_by_dtype"]["float32"] == record["not_as_precision_says"] > 0
    assert set(record["matmuls_by_dtype"]) == {"float64"}
    examples = "\n".join(record["examples"])
    assert "model.model.layers.0.input_layernorm: aten.rsqrt in float32 (forward" in examples
    warning = [line for line in (job / "train.log").read_text().splitlines() if "audit" in line]
    assert warning and "did not run as trainer.precision=64-true says" in warning[0]
    assert "input_layernorm" in warning[0]
