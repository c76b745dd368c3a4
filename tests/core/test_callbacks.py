"""kiln.core.callbacks: EMA, EarlyStopping and BestCheckpoint, each against a reference."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from checkpoint_files import saved_state
from toy import ToyTokenModule, count_loads, weights
from trainers import trainer_config

from kiln.core import StateChangedError, callbacks, fit
from kiln.core.callbacks import EMA, BestCheckpoint, EarlyStopping, FitHandle
from kiln.core.checkpoints.rundir import read_run_file

cfg = trainer_config


class Snapshots:
    """Records the weights after each optimizer step (a callback of its own)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.by_step: dict[int, dict[str, torch.Tensor]] = {}

    def on_loop_start(self, fit) -> None:
        self.fit = fit

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.by_step[self.fit.global_step] = weights(self.module)


def test_callbacks_get_a_fit_handle_and_its_old_name_warns() -> None:
    module = ToyTokenModule()
    snaps = Snapshots(module)
    fit(module, cfg(max_steps=1), callbacks=[snaps])
    assert isinstance(snaps.fit, FitHandle) and snaps.fit.global_step == 1
    with pytest.warns(DeprecationWarning, match="now kiln.core.callbacks.FitHandle"):
        assert callbacks.Loop is FitHandle
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        _ = callbacks.Nothing


def load(path: Path) -> dict:
    """A checkpoint's whole state (callback state: in meta.pt, weights_only-loadable)."""
    return saved_state(path, Path(tempfile.mkdtemp()))


# -- EMA ----------------------------------------------------------------------------------


def hand_ema(start: dict, steps: list[dict], decay: float) -> dict[str, torch.Tensor]:
    """ema = decay * ema + (1 - decay) * w after each step, in float64."""
    ema = {k: v.double() for k, v in start.items()}
    for w in steps:
        ema = {k: decay * ema[k] + (1 - decay) * w[k].double() for k in ema}
    return ema


def test_ema_equals_a_hand_computed_average_over_windows() -> None:
    module = ToyTokenModule()
    start = weights(module)
    ema, snaps = EMA(decay=0.7, validate_with_ema=False), Snapshots(module)
    fit(module, cfg(accumulate_grad_batches=2), callbacks=[ema, snaps])
    assert sorted(snaps.by_step) == [0, 1, 2, 3, 4]  # after micro-batch 0 of step 1: 0
    expected = hand_ema(start, [snaps.by_step[s] for s in (1, 2, 3, 4)], 0.7)
    got = ema.weights()
    assert sorted(got) == ["embed.weight", "head.bias", "head.weight"]
    for name, value in expected.items():
        torch.testing.assert_close(got[name].double(), value, rtol=1e-6, atol=1e-7)
    assert not torch.allclose(got["head.weight"], module.head.weight)  # an average, not a copy


def test_ema_every_n_steps_updates_on_those_steps_only() -> None:
    module = ToyTokenModule()
    start = weights(module)
    ema, snaps = EMA(decay=0.5, every_n_steps=2), Snapshots(module)
    fit(module, cfg(), callbacks=[ema, snaps])
    expected = hand_ema(start, [snaps.by_step[2], snaps.by_step[4]], 0.5)
    for name, value in expected.items():
        torch.testing.assert_close(ema.weights()[name].double(), value, rtol=1e-6, atol=1e-7)


def nll_with(module: ToyTokenModule, state: dict[str, torch.Tensor]) -> float:
    """The toy's val/nll, by hand, with ``state`` loaded into a copy of the module."""
    copy = ToyTokenModule()
    copy.load_state_dict(state, strict=False)
    data = module.val_data
    with torch.no_grad():
        logits = copy(data.ids)
        nll = F.cross_entropy(logits.flatten(0, 1), data.labels.flatten(), reduction="sum")
    return (nll / (data.labels != -100).sum()).item()


def test_ema_weights_are_validated_and_the_trained_ones_put_back() -> None:
    module = ToyTokenModule()
    ema, snaps = EMA(decay=0.5), Snapshots(module)
    result = fit(module, cfg(val_every_n_steps=4), callbacks=[ema, snaps])
    assert result.metrics["val/nll"] == pytest.approx(nll_with(module, ema.weights()), rel=1e-5)
    assert result.metrics["val/nll"] != pytest.approx(nll_with(module, weights(module)), rel=1e-3)
    for name, value in snaps.by_step[4].items():  # training's weights, as they were
        assert torch.equal(weights(module)[name], value)


def test_resumed_ema_equals_uninterrupted_ema(tmp_path: Path) -> None:
    whole = EMA(decay=0.6, validate_with_ema=False)
    fit(
        ToyTokenModule(),
        cfg(checkpoint_dir=str(tmp_path / "a"), checkpoint_every_n_steps=2),
        callbacks=[whole],
    )
    saved = load(tmp_path / "a" / "step-00000004.ckpt")["callbacks"]["EMA"]["weights"]
    resumed, module = EMA(decay=0.6, validate_with_ema=False), ToyTokenModule()
    loaded = count_loads(module)
    fit(
        module,
        cfg(checkpoint_dir=str(tmp_path / "b"), resume=str(tmp_path / "a" / "step-00000002.ckpt")),
        callbacks=[resumed],
    )
    assert loaded.calls == 2 * 4  # steps 3 and 4: a fresh run's EMA would end the same
    for name, value in whole.weights().items():
        assert torch.equal(resumed.weights()[name], value), name
        assert torch.equal(saved[name], value), name


def test_resume_without_the_saved_callback_state_fails_clearly(tmp_path: Path) -> None:
    fit(ToyTokenModule(), cfg(max_steps=1, checkpoint_dir=str(tmp_path)))
    with pytest.raises(StateChangedError, match=r"holds no state for callbacks/EMA.*allow_chang"):
        fit(ToyTokenModule(), cfg(checkpoint_dir=str(tmp_path), resume="auto"), callbacks=[EMA()])


# -- EarlyStopping and BestCheckpoint: a metric scripted by step --------------------------


class ScriptedToy(ToyTokenModule):
    """The toy whose validation metric ``val/score`` is scripted by the step it is taken at."""

    def __init__(self, script: dict[int, float]) -> None:
        super().__init__()
        self.script = script

    def on_loop_start(self, loop) -> None:  # the module gets kiln's hooks too
        self.loop = loop

    def validation_metrics(self, outputs):
        return {**super().validation_metrics(outputs), "score": self.script[self.loop.global_step]}


def test_early_stopping_stops_after_patience_validations_without_improvement(
    tmp_path: Path,
) -> None:
    # min_delta=0.1: after 4.0 at step 2, 3.95, 3.92 and 3.91 are no improvement
    script = {1: 5.0, 2: 4.0, 3: 3.95, 4: 3.92, 5: 3.91, 6: 1.0, 7: 0.5}
    trainer = cfg(
        max_steps=7,
        val_every_n_steps=1,
        log_every_n_steps=100,
        checkpoint_dir=str(tmp_path),
        checkpoint_every_n_steps=100,
    )
    stopper = EarlyStopping(monitor="val/score", patience=3, min_delta=0.1)
    result = fit(ScriptedToy(script), trainer, callbacks=[stopper])
    assert result.global_step == 5
    assert result.stop_reason.startswith("EarlyStopping: val/score did not improve")
    assert (stopper.best, stopper.best_step, stopper.wait) == (4.0, 2, 3)
    # the stop step finishes like a last step: logged and checkpointed
    assert [row["step"] for row in result.history] == [5]
    assert result.checkpoint == str(tmp_path / "step-00000005.ckpt")
    saved = load(tmp_path / "step-00000005.ckpt")
    assert saved["callbacks"]["EarlyStopping"] == {"best": 4.0, "best_step": 2, "wait": 3}
    # a resumed run stays stopped
    same = EarlyStopping(monitor="val/score", patience=3, min_delta=0.1)
    again = fit(ScriptedToy(script), cfg(**{**vars(trainer), "resume": "auto"}), callbacks=[same])
    assert again.global_step == 5 and again.stop_reason == result.stop_reason


def test_a_run_that_is_not_stopped_says_it_reached_max_steps() -> None:
    result = fit(ToyTokenModule(), cfg(max_steps=1))
    assert result.stop_reason == "max_steps"


def test_best_checkpoint_holds_the_weights_of_the_best_step(tmp_path: Path) -> None:
    script = {1: 0.1, 2: 0.5, 3: 0.3, 4: 0.7, 5: 0.6, 6: 0.2}
    module = ScriptedToy(script)
    best, snaps = BestCheckpoint(monitor="val/score", mode="max"), Snapshots(module)
    trainer = cfg(
        max_steps=6, val_every_n_steps=1, checkpoint_dir=str(tmp_path), checkpoint_every_n_steps=1
    )
    fit(module, trainer, callbacks=[best, snaps])
    assert (best.best, best.best_step, best.path) == (0.7, 4, tmp_path / "best.ckpt")
    saved = load(tmp_path / "best.ckpt")
    assert saved["global_step"] == 4
    assert saved["callbacks"]["BestCheckpoint"] == {"best": 0.7, "best_step": 4}
    for name, value in snaps.by_step[4].items():
        assert torch.equal(saved["model"][name], value), name
    # beside the loop's last K (keep_last_k=2), never pruned
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "best.ckpt",
        "run.json",
        "step-00000005.ckpt",
        "step-00000006.ckpt",
    ]
    # checksummed like the others, but never a candidate for resume="auto"
    recorded = read_run_file(tmp_path)
    assert list(recorded.checkpoints) == ["step-00000005.ckpt", "step-00000006.ckpt"]
    assert set(recorded.named) == {"best.ckpt"}


def assert_same(a, b, where: str = "checkpoint") -> None:
    """Two checkpoint trees hold the same values (tensors bit for bit)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), (where, sorted(a), sorted(b))
        for key in a:
            assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def test_best_checkpoint_holds_what_the_step_checkpoint_of_its_step_holds(tmp_path: Path) -> None:
    """best.ckpt is written after every callback has seen the step's metrics: its
    EarlyStopping state is that step's ({'best': 6.0, 'best_step': 7, 'wait': 0}), as in
    step-00000007.ckpt, not the state of the step before."""
    scores = [1, 3, 2, 5, 4, 4.5, 6, 0]
    script = {step: float(v) for step, v in enumerate(scores, start=1)}
    trainer = cfg(
        max_steps=8,
        val_every_n_steps=1,
        checkpoint_dir=str(tmp_path),
        checkpoint_every_n_steps=1,
        keep_last_k=8,
    )
    callbacks = [BestCheckpoint("val/score", "max"), EarlyStopping("val/score", "max", patience=5)]
    fit(ScriptedToy(script), trainer, callbacks=callbacks)
    best, step = load(tmp_path / "best.ckpt"), load(tmp_path / "step-00000007.ckpt")
    assert best["callbacks"]["EarlyStopping"] == {"best": 6.0, "best_step": 7, "wait": 0}
    assert_same(best, step)


def test_best_checkpoint_resumes_with_its_best_value(tmp_path: Path) -> None:
    script = {1: 0.1, 2: 0.5, 3: 0.3, 4: 0.4, 5: 0.45}
    trainer = cfg(max_steps=3, val_every_n_steps=1, checkpoint_dir=str(tmp_path))
    first = ScriptedToy(script)
    snaps = Snapshots(first)
    fit(first, trainer, callbacks=[BestCheckpoint(monitor="val/score"), snaps])
    best, module = BestCheckpoint(monitor="val/score"), ScriptedToy(script)
    loaded = count_loads(module)
    fit(module, cfg(**{**vars(trainer), "max_steps": 5, "resume": "auto"}), callbacks=[best])
    assert loaded.calls == 2 * 4  # steps 4 and 5: a fresh 5-step run would keep step 2 too
    # 0.4 and 0.45 after the resume are below the 0.5 of step 2: the file stays
    assert (best.best, best.best_step) == (0.5, 2)
    saved = load(tmp_path / "best.ckpt")
    assert saved["global_step"] == 2
    for name, value in snaps.by_step[2].items():
        assert torch.equal(saved["model"][name], value), name


@pytest.mark.parametrize("callback", [EarlyStopping(), BestCheckpoint(dirpath="unused")])
def test_a_monitored_metric_that_is_not_logged_fails_naming_the_available_ones(
    callback,
) -> None:
    with pytest.raises(ValueError, match=r"monitor='val/\w+'.*available: \['val/nll', 'val/s"):
        fit(ToyTokenModule(), cfg(max_steps=1, val_every_n_steps=1), callbacks=[callback])


def test_monitoring_without_validation_fails_at_the_start() -> None:
    class NoValidation(ToyTokenModule):
        val_dataloader = None

    with pytest.raises(ValueError, match="does not validate"):
        fit(NoValidation(), cfg(max_steps=1), callbacks=[EarlyStopping()])


def test_invalid_arguments_fail_clearly() -> None:
    with pytest.raises(ValueError, match="mode='maximum' is not valid"):
        BestCheckpoint(mode="maximum")
    with pytest.raises(ValueError, match="patience=0"):
        EarlyStopping(patience=0)
    with pytest.raises(ValueError, match=r"decay=1.0"):
        EMA(decay=1.0)
    with pytest.raises(ValueError, match=r"'step-00000001.ckpt' is not valid"):
        fit(
            ScriptedToy({1: 1.0}),
            cfg(max_steps=1, val_every_n_steps=1),
            callbacks=[BestCheckpoint("val/score", dirpath="x", filename="step-00000001.ckpt")],
        )
