"""Commands that only read or check the config import only what that needs: ``--help``,
``--cfg``, a config error and ``kiln-report --help`` never import torch, Fabric, the model
libraries or W&B (what they cost: ``scripts/bench_startup.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
HEAVY = ("torch", "lightning", "transformers", "timm", "wandb", "datasets", "evaluate")


def imported_modules(cmd: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run ``cmd`` (a console script) under ``-X importtime``; the top-level modules it imported."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", *cmd],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )
    names = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return proc, names


@pytest.mark.parametrize(
    ("cmd", "ok"),
    [
        (["kiln-train", "--help"], True),
        (["kiln-train", "--cfg", "job"], True),
        (["kiln-train", "trainer.no_such_key=1"], False),
        (["kiln-train", "optimizer.lr=-1"], False),
        (["kiln-bench", "--help"], True),
        (["kiln-report", "--help"], True),
    ],
    ids=["train-help", "train-cfg", "unknown-key", "bad-value", "bench-help", "report-help"],
)
def test_config_only_commands_skip_heavy_imports(cmd, ok, tmp_path):
    proc, names = imported_modules([str(BIN / cmd[0]), *cmd[1:]], tmp_path)
    assert (proc.returncode == 0) == ok, proc.stderr[-3000:]
    heavy = set(HEAVY)
    if cmd[1] == "optimizer.lr=-1":
        # a refused value is recorded as a failed job, whose machine record reads torch
        assert "optimizer.lr" in proc.stdout + proc.stderr, proc.stdout[-3000:]
        heavy.discard("torch")
    elif not ok:
        assert "no_such_key" in proc.stderr, proc.stderr[-3000:]
    assert not names & heavy, f"{' '.join(cmd)} imported {sorted(names & heavy)}"


def test_lazy_package_names_resolve():
    """Every name the lazy packages export resolves, and ``kiln.core.launch`` stays the
    function (a submodule import must not replace it)."""
    import kiln.core
    import kiln.core.distributed.launch  # binds the submodule on its package
    import kiln.models

    for package in (kiln.core, kiln.models):
        for name in package.__all__:
            assert getattr(package, name) is not None, f"{package.__name__}.{name}"
    assert (
        callable(kiln.core.launch) and kiln.core.launch.__module__ == "kiln.core.distributed.launch"
    )
    assert "bert-tiny-cls" in kiln.models.list_models()


def test_lazy_exports_match_all():
    import kiln.core
    import kiln.models

    for package in (kiln.core, kiln.models):
        assert sorted(package._exports) == sorted(package.__all__), package.__name__


EXIT_PROBE = """
import atexit, os

OUT = os.environ["EXIT_PROBE_DIR"]
atexit.register(lambda: open(os.path.join(OUT, "atexit"), "w").close())
FD = os.open(os.path.join(OUT, "teardown"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)


class Probe:  # collected by the interpreter's teardown of the modules
    def __del__(self, fd=FD, write=os.write):
        write(fd, b"ran")


probe = Probe()
"""


@pytest.mark.process
def test_a_finished_job_ends_its_process_without_the_interpreters_teardown(tmp_path):
    """After a job ends, kiln-train runs the exit handlers (W&B's, logging's, a plugin's) and
    ends the process without Python's teardown of every module (seconds with torch loaded)."""
    from train_helpers import FAST, run_train

    (tmp_path / "exit_probe.py").write_text(EXIT_PROBE)
    env = {"PYTHONPATH": str(tmp_path), "EXIT_PROBE_DIR": str(tmp_path)}
    proc = run_train([*FAST, "logger=csv", "plugins=[exit_probe]"], tmp_path, env=env, process=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "kiln-train: ok" in proc.stdout, proc.stdout[-2000:]  # stdout flushed
    assert (tmp_path / "atexit").exists()
    assert (tmp_path / "teardown").read_text() == ""


def test_collection_is_held_through_start_up_and_frozen_objects_are_released_after():
    import gc

    from kiln.experiments.settings.startup_gc import collection_held, startup_frozen

    assert gc.isenabled() and gc.get_freeze_count() == 0
    with startup_frozen():  # outside a held command (fit called from Python): no change
        assert gc.isenabled() and gc.get_freeze_count() == 0
    with collection_held():
        assert not gc.isenabled()
        with startup_frozen():
            assert gc.isenabled() and gc.get_freeze_count() > 0
        assert gc.get_freeze_count() == 0  # a sweep's next job does not keep this one's
    assert gc.isenabled() and gc.get_freeze_count() == 0


GC_PROBE = """
import gc, sys
full = []
gc.callbacks.append(lambda phase, info: phase == "stop" and info["generation"] == 2
                    and full.append(1))
import kiln.core.telemetry.machine as machine
calibrate = machine.calibrate_under_load

def probe(*args, **kwargs):
    if not hasattr(probe, "seen"):
        probe.seen = True
        print(f"GC at the measured work: full={len(full)} enabled={gc.isenabled()} "
              f"frozen={gc.get_freeze_count()} modules={len(sys.modules)}", flush=True)
    return calibrate(*args, **kwargs)

machine.calibrate_under_load = probe
from kiln.experiments.train.cli import main
sys.argv = ["kiln-train", *sys.argv[1:]]
main()
"""


@pytest.mark.process
def test_a_jobs_start_up_runs_no_full_collection_and_its_loop_skips_what_start_up_built(
    tmp_path,
):
    """A training job's imports and set-up would trigger about eight full collections (each
    scanning every object imported so far); kiln-train holds them off until the measured
    work, which starts with those objects frozen and the collector running."""
    import re

    from train_helpers import FAST

    proc = subprocess.run(
        [sys.executable, "-c", GC_PROBE, *FAST, "logger=csv", f"hydra.run.dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    probe = re.search(r"full=(\d+) enabled=(\w+) frozen=(\d+) modules=(\d+)", proc.stdout)
    assert probe is not None, proc.stdout[-2000:]
    full, enabled, frozen, modules = probe.groups()
    assert int(modules) > 2000  # torch, Lightning, transformers: start-up did import them
    # at most the console script's own imports (Hydra's config store) before it holds them
    assert int(full) <= 2, proc.stdout
    assert enabled == "True" and int(frozen) > 100_000


WANDB_INIT_PROBE = """
import sys
from kiln.experiments.settings.base import LoggerConfig
from kiln.experiments.tracking.tracker import import_early

import_early(LoggerConfig(backend=sys.argv[1]))
if sys.argv[1] != "wandb":
    print("wandb imported:", "wandb" in sys.modules)
    raise SystemExit
import wandb
before = set(sys.modules)
run = wandb.init(project="kiln-test", dir=sys.argv[2], mode="offline",
                 settings=wandb.Settings(silent=True, console="off"))
run.log({"x": 1.0})
run.finish()
late = sorted(m for m in set(sys.modules) - before if m.split(".")[0] in ("wandb", "pydantic"))
print("imported by wandb.init:", late)
"""


@pytest.mark.parametrize("backend", ["wandb", "csv", "none"])
def test_import_early_leaves_wandb_init_nothing_of_wandbs_own_to_import(backend, tmp_path):
    """W&B's pydantic models cost more the more modules are loaded (Python < 3.13): a job
    imports them right after its config, so ``wandb.init`` (after the model and Fabric)
    imports none of W&B's modules, and a run without W&B imports no W&B at all. Fails when
    a W&B release moves what ``wandb.init`` imports (update ``WANDB_INIT_IMPORTS``)."""
    proc = subprocess.run(
        [sys.executable, "-c", WANDB_INIT_PROBE, backend, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = "imported by wandb.init: []" if backend == "wandb" else "wandb imported: False"
    assert expected in proc.stdout, proc.stdout[-2000:]


WANDB_ORDER_PROBE = """
import sys
import kiln.core.telemetry.machine as machine
calibrate = machine.calibrate_under_load

def probe(*args, **kwargs):
    order = list(sys.modules)
    print("W&B before the model and Fabric:",
          order.index("wandb.sdk.launch") < min(order.index(m) for m in
              ("lightning.fabric", "transformers.models.bert.modeling_bert")), flush=True)
    return calibrate(*args, **kwargs)

machine.calibrate_under_load = probe
from kiln.experiments.train.cli import main
sys.argv = ["kiln-train", *sys.argv[1:]]
main()
"""


@pytest.mark.process
def test_a_wandb_job_imports_wandb_before_its_model_and_fabric(tmp_path):
    """The default job (W&B offline) imports what ``wandb.init`` needs before the model's
    and Fabric's modules: 0.44 s there against 0.84 s at ``wandb.init`` (5,000 modules)."""
    from train_helpers import FAST

    proc = subprocess.run(
        [sys.executable, "-c", WANDB_ORDER_PROBE, *FAST, f"hydra.run.dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "W&B before the model and Fabric: True" in proc.stdout, proc.stdout[-2000:]
