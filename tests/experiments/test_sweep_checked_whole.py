"""A sweep checks every job's config before its first job starts (issue 46): a bad value in
any job refuses the whole sweep in one message naming each bad job, its overrides and the
value, before a job directory (or the sweep's ``multirun.yaml``) is written; a good sweep
says what the check cost and runs."""

from pathlib import Path

import pytest
from in_process import kiln_command
from train_helpers import FAST, explain, run_train, summary

LM = ["model=llama-tiny-lm", "data=lm_text", "data.num_train=64", "data.num_val=16"]


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def refused_sweep(args: list[str], tmp_path: Path, command: str = "train") -> str:
    """``kiln-<command> -m args`` into ``<tmp_path>/sweep``: refused (exit 1) with nothing
    written there; returns its output (stdout, then stderr)."""
    sweep = tmp_path / "sweep"
    env = {"KILN_LOG_DIR": str(tmp_path), "WANDB_MODE": "offline"}
    proc = kiln_command(command, ["-m", *args, f"hydra.sweep.dir={sweep}"], env, tmp_path)
    assert proc.returncode == 1, explain(proc)
    assert not sweep.exists(), sorted(p.name for p in sweep.rglob("*"))  # no job dir, no yaml
    assert "Launching" not in proc.stdout, explain(proc)  # no job started
    return proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("args", "bad"),
    [
        (["optimizer.lr=1e-3,-1"], "job #1 optimizer.lr=-1: "),  # a range (the repro)
        ([*LM, "data.packing=false,no"], "job #1 data.packing=no: "),  # a group without schema
        (["optimizer.lr=1e-3,abc"], "job #1 optimizer.lr=abc: "),  # Hydra's own type check
    ],
    ids=["lr=-1", "packing=no", "lr=abc"],
)
def test_a_sweep_with_one_bad_job_is_refused_before_any_job_starts(tmp_path, args, bad):
    err = refused_sweep([*FAST, *args], tmp_path)
    assert "1 of 2 jobs" in err, err
    lines = [line for line in err.splitlines() if line.startswith("job #")]
    assert len(lines) == 1 and lines[0].startswith(bad), err  # job #0 is fine: not named
    key = bad.split()[2].split("=")[0]
    assert key in lines[0].removeprefix(bad), lines[0]  # the error names the key too
    assert "kiln: checked 2 jobs' configs in" in err, err


def test_every_bad_job_is_named_in_one_message(tmp_path):
    args = [*FAST, "optimizer.lr=-1,1e-3,-2", "trainer.log_every_n_steps=1,0"]
    err = refused_sweep(args, tmp_path)
    assert "5 of 6 jobs" in err, err
    lines = [line for line in err.splitlines() if line.startswith("job #")]
    named = {frozenset(line.split(":")[0].split()[2:]): line for line in lines}
    assert set(named) == {  # each bad job by the values that tell it from the others
        frozenset({"optimizer.lr=-1", "trainer.log_every_n_steps=1"}),
        frozenset({"optimizer.lr=-1", "trainer.log_every_n_steps=0"}),
        frozenset({"optimizer.lr=0.001", "trainer.log_every_n_steps=0"}),
        frozenset({"optimizer.lr=-2", "trainer.log_every_n_steps=1"}),
        frozenset({"optimizer.lr=-2", "trainer.log_every_n_steps=0"}),
    }, err
    lr_only = named[frozenset({"optimizer.lr=-2", "trainer.log_every_n_steps=1"})]
    assert "optimizer.lr=-2.0 is not valid" in lr_only, lr_only
    numbers = {int(line.split()[1].removeprefix("#")) for line in lines}
    assert len(numbers) == 5 and numbers < set(range(6)), err  # Hydra's job numbers


def test_a_refused_sweep_leaves_an_earlier_sweeps_directory_as_it_was(tmp_path):
    sweep = tmp_path / "sweep"
    (sweep / "0").mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("the earlier sweep's\n")
    (sweep / "0" / "summary.json").write_text('{"status": "ok"}\n')
    before = _files(sweep)
    env = {"KILN_LOG_DIR": str(tmp_path), "WANDB_MODE": "offline"}
    args = ["-m", *FAST, "optimizer.lr=1e-3,-1", f"hydra.sweep.dir={sweep}"]
    proc = kiln_command("train", args, env, tmp_path)
    assert proc.returncode == 1 and "job #1 optimizer.lr=-1: " in proc.stderr, explain(proc)
    assert _files(sweep) == before


@pytest.mark.parametrize("launcher", ["local_submitit", "slurm"])
def test_every_launcher_gets_the_check(tmp_path, launcher):
    args = [f"launcher={launcher}", "trainer.accelerator=cpu", "optimizer.lr=1e-3,-1"]
    err = refused_sweep([*FAST, *args], tmp_path)
    assert "job #1 optimizer.lr=-1: " in err, err


def test_a_launcher_key_is_checked_with_the_jobs(tmp_path):
    args = ["launcher=slurm", "trainer.accelerator=cpu", "hydra.launcher.preempt_requeue=maybe"]
    err = refused_sweep([*FAST, *args, "optimizer.lr=1e-3,-1"], tmp_path)
    assert "hydra.launcher.preempt_requeue='maybe'" in err and "job #1 optimizer.lr=-1" in err


def test_kiln_bench_sweeps_are_checked_too(tmp_path):
    err = refused_sweep(["bench.repeats=2,0"], tmp_path, command="bench")
    assert "job #1 bench.repeats=0: " in err and "bench.repeats=0" in err.split("job #1")[1], err


def test_a_good_sweep_is_checked_then_runs(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", *FAST, "trainer.max_steps=1", "logger=csv", "optimizer.lr=1e-3,2e-3"]
    proc = run_train([*args, f"hydra.sweep.dir={sweep}"], tmp_path)
    assert proc.returncode == 0, explain(proc)
    assert "kiln: checked 2 jobs' configs in" in proc.stdout + proc.stderr, explain(proc)
    assert [summary(sweep / n)["status"] for n in ("0", "1")] == ["ok", "ok"]
