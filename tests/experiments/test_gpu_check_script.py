"""``scripts/gpu_check.sh``: its parts, its refusal of an unknown one, and the suite models its
``suites`` part names (a typo there would only show on the GPU machine, minutes into a lent
session)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kiln.experiments.settings.suite_lists import list_batch_sizes

SCRIPT = Path(__file__).parents[2] / "scripts" / "gpu_check.sh"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_an_unknown_part_is_refused_naming_the_valid_ones():
    proc = _run("suite")
    assert proc.returncode == 2
    assert "unknown part 'suite'; use core, suites, all, quick or lm" in proc.stdout


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU machine runs it")
@pytest.mark.parametrize("part", ["core", "suites", "all"])
def test_without_a_gpu_every_part_says_so_and_exits_zero(part):
    proc = _run(part)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no CUDA GPU here" in proc.stdout


def _names(variable: str) -> list[str]:
    """The comma-separated models the script's ``variable`` (and its ``+=`` lines) hold."""
    text = SCRIPT.read_text()
    parts = re.findall(rf'{variable}\+?="([^"]*)"', text)
    return [name for part in parts for name in part.split(",") if name]


@pytest.mark.parametrize(("variable", "suite"), [("hf", "hf"), ("timm", "timm")])
def test_the_suites_part_runs_eight_models_of_each_list(variable, suite):
    names = _names(variable)
    assert len(names) == len(set(names)) == 8
    assert set(names) <= set(list_batch_sizes(suite)), set(names) - set(list_batch_sizes(suite))
    # the reduce-overhead rows are models the default rows also run
    ro = re.findall(rf"sweep=pt2_{suite} model\.arch=(\S+) \\$", SCRIPT.read_text(), re.M)
    assert ro and set(ro[0].split(",")) <= set(names)


def test_the_script_is_valid_bash():
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def profiles():
    import importlib.util
    import sys

    path = SCRIPT.parent / "check_gpu_profiles.py"
    spec = importlib.util.spec_from_file_location("check_gpu_profiles", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def _cuda_job(tmp_path: Path, name: str, **changes) -> dict:
    """A profiled CUDA job's summary.json as kiln-train writes it, with ``changes`` applied."""
    import pickle

    snapshot = tmp_path / name / "memory_snapshot.pickle"
    snapshot.parent.mkdir(parents=True)
    segments = changes.pop("segments", [{"address": 0, "total_size": 2**20, "blocks": []}])
    traces = changes.pop("traces", [[{"action": "alloc", "addr": 0, "size": 512}]])
    snapshot.write_bytes(pickle.dumps({"segments": segments, "device_traces": traces}))
    breakdown = {"step_ms": 4.0, "kernels_per_step": 120.0, "device_ms": {"matmul and linear": 1.0}}
    samples = {"sm_clock_mhz": [1980, 1965], "throttle_reasons": [0, 4]}
    record = {
        "compile_mode": "none",
        "profile": {"breakdown": breakdown, "memory_snapshot": str(snapshot)},
        "telemetry": {"machine_series": {"samples": samples}},
    }
    for key, value in changes.items():  # "profile.breakdown.kernels_per_step": 0, ...
        *parents, last = key.split(".")
        node = record
        for parent in parents:
            node = node[parent]
        node[last] = value
    (tmp_path / name / "summary.json").write_text(json.dumps(record))
    return record


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({}, None),
        ({"profile.breakdown.kernels_per_step": 0.0}, "no kernels per step"),
        ({"profile.breakdown.device_ms": {}}, "no kernel time by category"),
        ({"segments": []}, "holds no allocator segments"),
        ({"traces": [[]]}, "holds no allocation events"),
        ({"profile.memory_snapshot": None}, "no memory snapshot"),
        (
            {"telemetry.machine_series.samples": {"sm_clock_mhz": [None], "throttle_reasons": [0]}},
            "no SM clock",
        ),
        ({"telemetry.machine_series.samples": {"sm_clock_mhz": [1980]}}, "no throttle reasons"),
    ],
)
def test_the_profile_check_names_what_a_cuda_job_lacks(tmp_path, profiles, changes, problem):
    _cuda_job(tmp_path, "0")
    _cuda_job(tmp_path, "1", **changes)
    lines, problems = profiles.check(tmp_path, jobs=2)
    assert len(lines) == 2 and "120 kernels/step" in lines[0] and "1965-1980 MHz" in lines[0]
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problems[0].startswith("1: ") and problem in problems[0]


def test_the_profile_check_counts_the_jobs(tmp_path, profiles):
    _cuda_job(tmp_path, "0")
    _, problems = profiles.check(tmp_path, jobs=2)
    assert problems == [f"1 job summaries in {tmp_path}, expected 2"]


def test_the_profile_check_reads_where_kiln_train_writes(tmp_path, profiles):
    # on the CPU a profiled job has everything but what only CUDA gives: the check reads
    # the breakdown, snapshot and series at the paths kiln-train writes them to
    from train_helpers import FAST, job_dirs, run_train

    args = [*FAST, "trainer.max_steps=7", "profile=steps", "profile.active=2", "logger=csv"]
    proc = run_train([*args, "trainer.machine_sample_s=0.2"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (job,) = job_dirs(tmp_path)
    record = json.loads((job / "summary.json").read_text())
    assert record["telemetry"]["machine_series"]["samples"]["own_cpu_cores"]
    assert profiles.job_problems(record) == [
        "no kernels per step",
        "no kernel time by category (device_ms)",
        "no memory snapshot",
        "no SM clock in the machine series",
        "no throttle reasons in the machine series",
    ]
