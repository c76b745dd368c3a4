"""A job's record is its own (issue 44, parts 2 and 3): kiln-eval and kiln-export never write
into a job's directory nor mix two models' files in one, and a copied job is evaluated and
exported from its own checkpoints, never the original's. One job shared by the module: the
tiny BERT trained to step 2, copied, then trained on to step 4."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from export_helpers import kiln
from train_helpers import explain, run_train, summary

BASE = [
    "model=bert-tiny-cls",
    "data.num_train=64",
    "data.num_val=32",
    "data.batch_size=8",
    "trainer.log_every_n_steps=1",
    "compile.backend=aot_eager",
]
QUIET = ["--limit-batches", "1", "--wandb-mode", "disabled"]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict[str, Path]:
    """``J`` trained to step 4, ``J2`` its copy taken at step 2, ``bare`` a copy of ``J2``
    without its checkpoints."""
    root = tmp_path_factory.mktemp("records_tools")
    job = root / "J"
    proc = run_train([*BASE, "trainer.max_steps=2", f"hydra.run.dir={job}"], root)
    assert proc.returncode == 0, explain(proc)
    copy = root / "J2"
    shutil.copytree(job, copy, symlinks=True)
    shutil.copytree(
        copy, root / "bare", symlinks=True, ignore=shutil.ignore_patterns("checkpoints")
    )
    proc = run_train([*BASE, "trainer.max_steps=4", f"hydra.run.dir={job}"], root)
    assert proc.returncode == 0, explain(proc)
    assert summary(job)["global_step"] == 4 and summary(copy)["global_step"] == 2
    return {"J": job, "J2": copy, "bare": root / "bare", "root": root}


def tree(directory: Path) -> dict[str, str]:
    """Every file below ``directory`` (relative path) with a digest of its bytes."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def refused(proc, *named: object) -> str:
    """The one-line error of a refused command (exit 2, no traceback) naming each of ``named``."""
    assert proc.returncode == 2, explain(proc)
    assert "Traceback" not in proc.stderr, proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if "error:" in line]
    for name in named:
        assert str(name) in line, line
    return line


def test_kiln_eval_writes_nothing_into_the_job(jobs):
    job = jobs["J"]
    before = tree(job)
    proc = kiln("eval", job, "--out", job / "summary.json", *QUIET)
    line = refused(proc, job / "summary.json", job, "give --out")
    assert "kiln job directory" in line
    proc = kiln("eval", job, "--out", job / "checkpoints" / "eval.json", *QUIET)
    refused(proc, job / "checkpoints" / "eval.json")
    # by default, and logging to the job's offline W&B run: beside the job, not in it
    proc = kiln("eval", job, "--limit-batches", "1")
    assert proc.returncode == 0, explain(proc)
    out = job.parent / "J-eval" / "eval.json"
    assert json.loads(out.read_text())["global_step"] == 4
    assert (job.parent / "J-eval" / "wandb").is_dir()
    assert tree(job) == before


def test_kiln_export_refuses_a_job_dir_and_another_models_files(jobs, tmp_path):
    job = jobs["J"]
    before = tree(job)
    refused(kiln("export", job, job), job, "give a new or empty directory")
    refused(kiln("export", job, job / "exported"), job / "exported")
    assert tree(job) == before
    other = tmp_path / "t5"  # another model's export: nothing of ours may join it
    other.mkdir()
    (other / "kiln_export.json").write_text(
        json.dumps({"run_id": "0123456789abcdef", "model": {"name": "t5-tiny-seq2seq"}})
    )
    (other / "generation_config.json").write_text("{}")
    theirs = tree(other)
    refused(kiln("export", job, other), other, "t5-tiny-seq2seq", "this same job")
    assert tree(other) == theirs
    unknown = tmp_path / "notes"
    unknown.mkdir()
    (unknown / "notes.txt").write_text("mine")
    refused(kiln("export", job, unknown), unknown, "notes.txt")
    assert tree(unknown) == {"notes.txt": hashlib.sha256(b"mine").hexdigest()}


def test_kiln_export_replaces_an_earlier_export_of_the_same_job_whole(jobs, tmp_path):
    out = tmp_path / "bert"
    proc = kiln("export", jobs["J2"], out)
    assert proc.returncode == 0, explain(proc)
    first = json.loads((out / "kiln_export.json").read_text())
    assert first["global_step"] == 2 and "config.json" in first["files"]
    proc = kiln("eval", out, *QUIET)  # its eval.json: of the export, replaced with it
    assert proc.returncode == 0, explain(proc)
    assert (out / "eval.json").is_file()
    proc = kiln("export", jobs["J"], out)  # the same run, trained on: replaces it
    assert proc.returncode == 0, explain(proc)
    second = json.loads((out / "kiln_export.json").read_text())
    assert second["global_step"] == 4
    assert sorted(tree(out)) == sorted([*second["files"], "kiln_export.json"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bert"]  # no staging left


def test_a_copied_job_is_evaluated_and_exported_from_its_own_checkpoints(jobs, tmp_path):
    copy = jobs["J2"]
    proc = kiln("eval", copy, "--out", tmp_path / "eval.json", *QUIET)
    assert proc.returncode == 0, explain(proc)
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["global_step"] == 2
    assert Path(result["checkpoint"]).is_relative_to(copy.resolve()), result["checkpoint"]
    proc = kiln("export", copy, tmp_path / "exported")
    assert proc.returncode == 0, explain(proc)
    record = json.loads((tmp_path / "exported" / "kiln_export.json").read_text())
    assert record["global_step"] == 2
    assert Path(record["checkpoint"]).is_relative_to(copy.resolve()), record["checkpoint"]


def test_a_copy_without_its_checkpoints_is_refused_naming_them(jobs, tmp_path):
    bare = jobs["bare"]
    for proc in (
        kiln("eval", bare, "--out", tmp_path / "eval.json", *QUIET),
        kiln("export", bare, tmp_path / "exported"),
    ):
        refused(proc, bare / "checkpoints", "is missing")
    assert not (tmp_path / "eval.json").exists() and not (tmp_path / "exported").exists()
