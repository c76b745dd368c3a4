"""Checkpoint state is a registry of ``Stateful`` pieces, each registered by the code that owns
it (``kiln.core.checkpoints.registry``): saving and resuming iterate it. A piece the module
registers (``checkpoint_state()``) is saved and restored with the rest; a run directory
written before the registry (``data/run_05087a5``: the toy with EMA and a scheduler, 4 steps,
every counter at the top level of ``meta.pt``) resumes as an uninterrupted run."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from test_resume import MODULE_KW, assert_same_weights, losses, trainer
from toy import ToyTokenModule, weights

from kiln.core import StateChangedError, fit, read_checkpoint_meta
from kiln.core.callbacks import EMA
from kiln.core.checkpoints.registry import CheckpointState, Record

FIXTURE = Path(__file__).parent / "data" / "run_05087a5"


class Counter:
    """A piece of state the module owns: how many windows it has seen."""

    def __init__(self) -> None:
        self.windows = 0
        self.loaded: list[int] = []

    def state_dict(self) -> dict[str, int]:
        return {"windows": self.windows}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.windows = state["windows"]
        self.loaded.append(state["windows"])


class CountingToy(ToyTokenModule):
    """The toy, registering its counter: the one line a feature's state needs."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.counter = Counter()

    def on_window_start(self, window: list[Any]) -> None:  # the module is a listener too
        self.counter.windows += 1

    def checkpoint_state(self) -> dict[str, Any]:
        return {"windows_seen": self.counter}


def test_a_piece_the_module_registers_is_saved_and_restored(tmp_path: Path) -> None:
    first = CountingToy(**MODULE_KW)
    fit(first, trainer(tmp_path, 4))
    assert first.counter.windows == 4
    saved = torch.load(tmp_path / "ckpt" / "step-00000004.ckpt" / "meta.pt", weights_only=True)
    assert saved["windows_seen"] == {"windows": 4}
    assert saved["loop"]["global_step"] == 4  # the loop's counters are a registered piece too

    resumed = CountingToy(**MODULE_KW)
    fit(resumed, trainer(tmp_path, 6, resume="auto"))
    assert resumed.counter.loaded == [4]  # restored before the loop went on
    assert resumed.counter.windows == 6


def test_the_registry_refuses_a_key_twice_and_an_object_without_state() -> None:
    state = CheckpointState()
    state.register("config", Record({"lr": 1}))
    with pytest.raises(ValueError, match="'config' is registered twice"):
        state.register("config", Record({}))
    with pytest.raises(ValueError, match="has no state_dict"):
        state.register("plain", 3)


def test_a_run_written_before_the_registry_resumes_as_an_uninterrupted_run(tmp_path) -> None:
    old = tmp_path / "old"
    shutil.copytree(FIXTURE, old)
    meta = read_checkpoint_meta(old / "ckpt" / "step-00000004.ckpt")
    assert meta["global_step"] == 4 and meta["run_id"]  # read from the top-level layout
    module, ema = ToyTokenModule(**MODULE_KW), EMA(decay=0.9)
    result = fit(module, trainer(old, 8, resume="auto"), callbacks=[ema])
    assert result.history[0]["step"] == 1  # the checkpoint's history came back with it
    assert [step for step, _ in losses(result)] == list(range(1, 9))

    plain_module, plain_ema = ToyTokenModule(**MODULE_KW), EMA(decay=0.9)
    plain = fit(plain_module, trainer(tmp_path / "plain", 8), callbacks=[plain_ema])
    # written on this project's CI machine by 05087a5: the same CPU continues it bit for
    # bit; another CPU's kernels may round the first steps differently
    fit(ToyTokenModule(**MODULE_KW), trainer(tmp_path / "four", 4), callbacks=[EMA(decay=0.9)])
    written, now = _step_4_weights(FIXTURE), _step_4_weights(tmp_path / "four")
    if all(torch.equal(written[key], now[key]) for key in written):
        assert_same_weights(weights(module), weights(plain_module))
        assert_same_weights(ema.state_dict()["weights"], plain_ema.state_dict()["weights"])
        assert losses(result) == losses(plain)
    else:
        for key, value in weights(plain_module).items():
            torch.testing.assert_close(weights(module)[key], value, rtol=1e-5, atol=1e-6)


def _step_4_weights(run: Path) -> dict[str, torch.Tensor]:
    """Every weight at step 4 (one tensor can agree while another's kernels rounded apart)."""
    from kiln.core import load_weights

    module = ToyTokenModule(**MODULE_KW)
    load_weights(module, run / "ckpt" / "step-00000004.ckpt")
    return weights(module)


def _ema_run(tmp_path: Path) -> None:
    """4 steps with EMA: every checkpoint holds ``callbacks/EMA``."""
    fit(ToyTokenModule(**MODULE_KW), trainer(tmp_path, 4), callbacks=[EMA(decay=0.9)])


def test_a_callbacks_state_with_no_callback_to_take_it_is_refused_by_name(tmp_path) -> None:
    _ema_run(tmp_path)
    with pytest.raises(StateChangedError, match=r"callbacks/EMA.*allow_changed_state=true"):
        fit(ToyTokenModule(**MODULE_KW), trainer(tmp_path, 6, resume="auto"))
    assert not (tmp_path / "ckpt" / "step-00000006.ckpt").exists()  # refused: trained nothing


def test_one_of_two_callbacks_states_left_behind_is_refused_by_name(tmp_path) -> None:
    # the other callback takes its state: only the one left behind is named
    slow = EMA(decay=0.5)
    slow.state_key = "EMA-slow"
    fit(ToyTokenModule(**MODULE_KW), trainer(tmp_path, 4), callbacks=[EMA(decay=0.9), slow])
    with pytest.raises(StateChangedError, match=r"callbacks/EMA-slow") as refused:
        fit(ToyTokenModule(**MODULE_KW), trainer(tmp_path, 6, resume="auto"),
            callbacks=[EMA(decay=0.9)])  # fmt: skip
    assert "callbacks/EMA " not in f"{refused.value} "  # the EMA that came back took its own
    assert not (tmp_path / "ckpt" / "step-00000006.ckpt").exists()


def test_dropping_a_callbacks_state_deliberately_says_so_once(tmp_path, capsys) -> None:
    _ema_run(tmp_path)
    capsys.readouterr()
    config = trainer(tmp_path, 6, resume="auto", allow_changed_state=True)
    result = fit(ToyTokenModule(**MODULE_KW), config)
    assert result.global_step == 6
    assert result.changed_state == ["callbacks/EMA dropped"]
    assert capsys.readouterr().out.count("dropped callbacks/EMA") == 1
    saved = torch.load(tmp_path / "ckpt" / "step-00000006.ckpt" / "meta.pt", weights_only=True)
    assert "callbacks" not in saved  # dropped, as the run said

    # the callback back on a checkpoint without its state: refused by name, not a KeyError
    with pytest.raises(StateChangedError, match=r"holds no state for callbacks/EMA"):
        fit(ToyTokenModule(**MODULE_KW), trainer(tmp_path, 8, resume="auto"),
            callbacks=[EMA(decay=0.9)])  # fmt: skip
    config = trainer(tmp_path, 8, resume="auto", allow_changed_state=True)
    ema = EMA(decay=0.9)
    result = fit(ToyTokenModule(**MODULE_KW), config, callbacks=[ema])
    assert result.changed_state == ["callbacks/EMA started fresh"]
    saved = torch.load(tmp_path / "ckpt" / "step-00000008.ckpt" / "meta.pt", weights_only=True)
    assert "EMA" in saved["callbacks"]


def test_a_resume_with_the_same_callbacks_changes_no_state(tmp_path) -> None:
    _ema_run(tmp_path)
    result = fit(ToyTokenModule(**MODULE_KW), trainer(tmp_path, 6, resume="auto"),
                 callbacks=[EMA(decay=0.9)])  # fmt: skip
    assert result.changed_state == []
