"""A run directory of the earlier release, whose checkpoints are one ``torch.save`` file each
(``data/legacy_run``: ``test_resume``'s toy, 4 steps, written by kiln at be27e23), still
resumes: ``resume='auto'`` continues it bit for bit as an uninterrupted run (on a CPU that
computes its first steps as the one that wrote it did; elsewhere to rounding), and its next
checkpoints are the directories every strategy reads. Its weights load into a plain module
(kiln-export, kiln-eval), and an FSDP run is told which strategy resumes it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from test_resume import MODULE_KW, assert_same_weights, losses, trainer
from toy import ToyTokenModule, count_loads, weights

from kiln.core import fit
from kiln.core.checkpoints.load import load_weights, read_checkpoint_meta
from kiln.core.checkpoints.lookup import damage, is_legacy

LEGACY = Path(__file__).parent / "data" / "legacy_run"
STEPS = 8


@pytest.fixture
def legacy(tmp_path) -> Path:
    shutil.copytree(LEGACY, tmp_path, dirs_exist_ok=True)
    return tmp_path


def test_a_run_of_the_earlier_release_resumes_as_an_uninterrupted_run(legacy, tmp_path) -> None:
    newest = legacy / "ckpt" / "step-00000004.ckpt"
    assert is_legacy(newest) and damage(newest) is None  # its run.json checksum still holds
    assert read_checkpoint_meta(newest)["global_step"] == 4
    module = ToyTokenModule(**MODULE_KW)
    loaded = count_loads(module)
    result = fit(module, trainer(legacy, STEPS, resume="auto"))
    assert loaded.calls == (STEPS - 4) * 4  # resumed at step 4: 4 samples a step after it

    plain = ToyTokenModule(**MODULE_KW)
    uninterrupted = fit(plain, trainer(tmp_path / "plain", STEPS))
    if _computes_as_the_fixtures_machine(tmp_path):
        assert_same_weights(weights(module), weights(plain))
        assert losses(result)[-4:] == losses(uninterrupted)[-4:]
    else:  # the same steps, rounded as this CPU's kernels round: equal to rounding only
        for key, value in weights(plain).items():
            torch.testing.assert_close(weights(module)[key], value, rtol=1e-5, atol=1e-6)
        got, want = losses(result)[-4:], losses(uninterrupted)[-4:]
        assert [step for step, _ in got] == [step for step, _ in want]
        assert [loss for _, loss in got] == pytest.approx([loss for _, loss in want], rel=1e-5)
    # the run goes on in the format every strategy reads; keep_last_k=2 pruned the old files
    assert sorted(p.name for p in (legacy / "ckpt").glob("step-*")) == [
        "step-00000006.ckpt",
        "step-00000008.ckpt",
    ]
    assert (legacy / "ckpt" / "step-00000008.ckpt" / ".metadata").is_file()


def _computes_as_the_fixtures_machine(tmp_path: Path) -> bool:
    """Whether 4 steps here give the fixture's step-4 weights bit for bit. Its run was made
    on another CPU; one whose kernels round differently (an AMD EPYC did, by 6e-8) cannot
    continue it bit for bit, only as exactly as its own arithmetic allows."""
    module = ToyTokenModule(**MODULE_KW)
    fit(module, trainer(tmp_path / "four", 4))
    saved = torch.load(LEGACY / "ckpt" / "step-00000004.ckpt", weights_only=True)["model"]
    return all(torch.equal(value, saved[key]) for key, value in weights(module).items())


def test_its_weights_load_into_a_plain_module(legacy) -> None:
    path = legacy / "ckpt" / "step-00000004.ckpt"
    module = ToyTokenModule(**MODULE_KW)
    load_weights(module, path)
    saved = torch.load(path, weights_only=True)["model"]
    assert_same_weights(weights(module), saved)


def test_an_fsdp_run_is_told_which_strategy_resumes_it(legacy) -> None:
    with pytest.raises(ValueError, match=r"one file, .* resume it with trainer.strategy=ddp"):
        fit(ToyTokenModule(**MODULE_KW), trainer(legacy, STEPS, resume="auto", strategy="fsdp"))
