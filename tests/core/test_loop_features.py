"""The loop's other promises: torch.compile, fp16 skipped steps, the NaN stop, bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.fabric.plugins.precision.amp import MixedPrecision
from toy import ToyTokenModule, weights

from kiln.core import CompileConfig, NonFiniteLossError, TrainerConfig, fit


def cfg(**kw) -> TrainerConfig:
    base = dict(accelerator="cpu", progress=False, log_every_n_steps=1, max_steps=4)
    return TrainerConfig(**{**base, **kw})


def test_inductor_compiled_run_matches_eager_and_reports_telemetry() -> None:
    eager_module, compiled_module = ToyTokenModule(), ToyTokenModule()
    eager = fit(eager_module, cfg())
    compiled = fit(compiled_module, cfg(), CompileConfig(mode="default", backend="inductor"))
    for key, value in weights(eager_module).items():
        torch.testing.assert_close(weights(compiled_module)[key], value, rtol=1e-4, atol=1e-5)
    t = compiled.telemetry
    assert t["compile_time_s"] > 0
    assert t["graph_breaks"] == 0
    assert t["step_time_median_s"] > 0 and t["samples_per_s"] > 0
    assert t["tokens_per_s"] > 0  # the toy module counts tokens
    assert t["peak_memory_mb"] > 0
    assert eager.telemetry["compile_time_s"] == 0


def test_compiled_checkpoint_resumes_eagerly(tmp_path: Path) -> None:
    ckpt = str(tmp_path / "ckpt")
    fit(
        ToyTokenModule(),
        cfg(checkpoint_dir=ckpt, max_steps=2),
        CompileConfig(mode="default", backend="aot_eager"),
    )
    state = torch.load(next(Path(ckpt).glob("step-*.ckpt")), weights_only=False)
    assert not any("_orig_mod" in key for key in state["model"])
    resumed = fit(ToyTokenModule(), cfg(checkpoint_dir=ckpt, max_steps=4, resume="auto"))
    assert resumed.global_step == 4


class LambdaToy(ToyTokenModule):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.lr)
        self.last_scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
        return {"optimizer": opt, "lr_scheduler": self.last_scheduler}


def test_fp16_skipped_steps_are_counted_and_do_not_advance_the_scheduler() -> None:
    # A huge initial loss scale overflows fp16 gradients until the scaler has backed off.
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**30)
    module = LambdaToy()
    result = fit(module, cfg(max_steps=24), plugins=[MixedPrecision("16-mixed", "cpu", scaler)])
    skipped = result.telemetry["skipped_steps"]
    assert 0 < skipped < 24
    assert result.history[-1]["train/skipped_steps"] == skipped
    # LambdaLR's last_epoch counts its steps: one per applied (not skipped) update
    assert module.last_scheduler.last_epoch == 24 - skipped


class NaNToy(ToyTokenModule):
    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        if batch_idx >= 4:  # step 3 onwards (2 micro-batches per step)
            out["loss"] = out["loss"] * float("nan")
        return out


def test_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path) -> None:
    ckpt = tmp_path / "ckpt"
    with pytest.raises(NonFiniteLossError, match="loss is nan at step 3"):
        fit(
            NaNToy(),
            cfg(
                max_steps=6,
                accumulate_grad_batches=2,
                checkpoint_dir=str(ckpt),
                checkpoint_every_n_steps=1,
                keep_last_k=5,
                log_every_n_steps=10,
            ),
        )
    assert sorted(p.name for p in ckpt.glob("step-*.ckpt")) == [
        "step-00000001.ckpt",
        "step-00000002.ckpt",
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(accumulate_grad_batches=0), "accumulate_grad_batches=0 is not valid"),
        (dict(precision="fp8"), "32-true, 64-true, bf16-mixed, 16-mixed"),
        (dict(max_steps=0), "max_steps=0"),
        (dict(gradient_clip_norm=-1.0), "gradient_clip_norm"),
        (dict(resume="auto"), "checkpoint_dir"),
    ],
)
def test_bad_trainer_arguments_fail_before_training(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        TrainerConfig(**kwargs)


def test_unknown_compile_mode_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="default, reduce-overhead, max-autotune"):
        CompileConfig(mode="fastest")


class WiderToy(ToyTokenModule):
    def __init__(self) -> None:
        super().__init__()
        self.extra = torch.nn.Linear(3, 3)


def test_checkpoint_of_another_model_fails_before_training(tmp_path: Path) -> None:
    ckpt = str(tmp_path / "ckpt")
    fit(ToyTokenModule(), cfg(checkpoint_dir=ckpt, max_steps=1))
    with pytest.raises(Exception, match="extra"):
        fit(WiderToy(), cfg(checkpoint_dir=ckpt, max_steps=2, resume="auto"))


class DtypeToy(ToyTokenModule):
    seen: list[torch.dtype]

    def training_step(self, batch, batch_idx):
        self.seen = [*getattr(self, "seen", []), self(batch["input_ids"]).dtype]
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("compiled", [False, True])
def test_bf16_mixed_autocasts_the_step_on_one_eager_or_compiled_device(compiled: bool) -> None:
    # Fabric only routes step hooks through forward (and its autocast) for wrapped modules.
    module = DtypeToy()
    compile_cfg = CompileConfig(mode="default", backend="eager") if compiled else None
    fit(module, cfg(max_steps=1, precision="bf16-mixed"), compile_cfg)
    assert module.seen and set(module.seen) == {torch.bfloat16}


class SampleToy(ToyTokenModule):
    items_are_tokens = False


def test_tokens_per_second_only_when_the_items_are_tokens() -> None:
    assert "tokens_per_s" not in fit(SampleToy(), cfg(max_steps=2)).telemetry
    assert fit(ToyTokenModule(), cfg(max_steps=2)).telemetry["tokens_per_s"] > 0


def test_deterministic_mode_does_not_leak_into_the_next_run() -> None:
    assert not torch.are_deterministic_algorithms_enabled()
    fit(ToyTokenModule(), cfg(max_steps=1, deterministic=True))
    assert not torch.are_deterministic_algorithms_enabled()


class TrainOnlyToy(ToyTokenModule):
    def val_dataloader(self):
        return None  # no validation: the compile figures are training's alone


@pytest.mark.slow  # two compiles: ~40-60 s on a shared 2-core machine
def test_each_fit_compiles_from_a_clean_dynamo_state() -> None:
    # Two jobs of a sweep in one process, different batch sizes: the second must report its
    # own compile (not reuse the first one's graphs, nor count a recompile against them).
    compile = CompileConfig(mode="default", backend="aot_eager")
    runs = [
        fit(TrainOnlyToy(n=16, batch_size=b), cfg(max_steps=2), compile).telemetry for b in (2, 4)
    ]
    for t in runs:
        assert t["compile_time_s"] > 0
        assert t["unique_graphs"] >= 1
        assert t["recompiles"] == 0
    assert runs[1]["unique_graphs"] == runs[0]["unique_graphs"]
