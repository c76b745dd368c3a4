"""A new plugin (tests/ner_plugin: a tiny ELECTRA tagger with an export format of its own)
installed into an environment layered on the workspace's with the command the docs give
(``uv pip install --no-deps``), run from outside the repository on a local NER file with
string tags: ``kiln-train`` sweeps it over two precisions, ``kiln-export`` writes its own
format, and ``kiln.models.testing.run_kit`` passes on it, trained on that file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from in_process import user_env
from train_helpers import FAST, explain, job_dirs, summary

PLUGIN_SRC = Path(__file__).resolve().parents[1] / "ner_plugin"
PEOPLE = [["Ann", "Lee"], ["Bo"], ["Cy", "Moss"]]
PLACES = [["Oslo"], ["New", "York"], ["Lima"]]


def ner_rows(n: int) -> list[dict]:
    """Sentences with IOB2 string tags: '<person> visited <place> .'"""
    rows = []
    for i in range(n):
        person, place = PEOPLE[i % 3], PLACES[(i // 3) % 3]
        tokens = [*person, "visited", *place, "."]
        tags = ["B-PER"] + ["I-PER"] * (len(person) - 1) + ["O"]
        tags += ["B-LOC"] + ["I-LOC"] * (len(place) - 1) + ["O"]
        rows.append({"tokens": tokens, "tags": tags})
    return rows


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv that sees the workspace's packages, with the plugin installed into it."""
    venv = tmp_path_factory.mktemp("user") / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)  # type: ignore[attr-defined]
    site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    workspace = sysconfig.get_paths()["purelib"]
    (site / "kiln_workspace.pth").write_text(f"import site; site.addsitedir({workspace!r})\n")
    python = venv / "bin" / "python"
    uv = shutil.which("uv")
    assert uv, "uv installs the plugin; put it on PATH"
    proc = subprocess.run(
        [uv, "pip", "install", "--no-deps", "--python", str(python), str(PLUGIN_SRC)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return python


def run(python: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    extra = {"KILN_LOG_DIR": str(cwd), "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    environ = {k: v for k, v in user_env().items() if k != "PYTHONPATH"}
    return subprocess.run(
        [str(python), *args], env={**environ, **extra}, cwd=cwd, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip


@pytest.mark.process
def test_a_new_plugin_trains_exports_and_passes_the_kit_on_local_ner_files(env, tmp_path):
    data = tmp_path / "ner.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ner_rows(48)))
    train = ["-m", "kiln.experiments.train", "--multirun", "model=electra-ner", "data=my_ner",
             f"data.dataset={data}", *FAST, "precision=32-true,bf16-mixed"]  # fmt: skip
    proc = run(env, train, tmp_path)
    assert proc.returncode == 0, explain(proc)
    jobs = job_dirs(tmp_path)  # a sweep of the plugin's model, one job per precision
    records = {summary(job)["precision"]: (job, summary(job)) for job in jobs}
    assert sorted(records) == ["32-true", "bf16-mixed"]
    for _, record in records.values():
        assert record["status"] == "ok", record.get("error")
        assert {"val/f1", "val/precision", "val/recall"} <= set(record["metrics"])
    job = records["32-true"][0]

    export = run(env, ["-m", "kiln.experiments.export", str(job), "exported"], tmp_path)
    assert export.returncode == 0, explain(export)
    tags = json.loads((tmp_path / "exported" / "tags.json").read_text())
    assert sorted(tags.values()) == ["B-LOC", "B-PER", "I-LOC", "I-PER", "O"]
    assert tags["0"] == "O" and (tmp_path / "exported" / "tagger.safetensors").is_file()

    kit = (
        "import sys\n"
        "from kiln.models.data import TokenClassificationData\n"
        "from kiln.models.testing import run_kit\n"
        "def own(): return TokenClassificationData(dataset=sys.argv[1], batch_size=8, "
        "max_length=32, val_fraction=0.25)\n"
        "run_kit('electra-ner', sys.argv[2], data=own)\n"
        "print('kit passed')\n"
    )
    proc = run(env, ["-c", kit, str(data), str(tmp_path / "kit")], tmp_path)
    assert proc.returncode == 0 and "kit passed" in proc.stdout, explain(proc)
    assert (tmp_path / "kit" / "check_export" / "export" / "tagger.safetensors").is_file()
    assert not (Path(os.getcwd()) / "exported").exists()
