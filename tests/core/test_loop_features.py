"""The loop's other promises: torch.compile, fp16 skipped steps, the NaN stop, bad input."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.fabric.plugins.precision.amp import MixedPrecision
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.utils.data import DataLoader, TensorDataset
from toy import ToyTokenModule, count_loads, weights
from trainers import trainer_config

from kiln.core import (
    CompileConfig,
    EmptyWindowError,
    NonFiniteGradientError,
    NonFiniteLossError,
    TrainerConfig,
    fit,
)

cfg = trainer_config


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
    saved = FileSystemReader(next(Path(ckpt).glob("step-*.ckpt"))).read_metadata()
    assert not any("_orig_mod" in key for key in saved.state_dict_metadata)
    module = ToyTokenModule()
    loaded = count_loads(module)
    resumed = fit(module, cfg(checkpoint_dir=ckpt, max_steps=4, resume="auto"))
    assert resumed.global_step == 4
    assert loaded.calls == 2 * 4  # steps 3 and 4 of 4 samples: it loaded the compiled run's


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


@pytest.mark.parametrize(
    ("mode", "backend", "graphs"),
    [
        ("reduce-overhead", "inductor", True),
        ("max-autotune", "inductor", True),
        ("max-autotune-no-cudagraphs", "inductor", False),
        ("default", "inductor", False),
        ("reduce-overhead", "aot_eager", False),  # the mode only applies to inductor
        ("none", "inductor", False),
    ],
)
def test_which_compile_modes_capture_cuda_graphs(mode: str, backend: str, graphs: bool) -> None:
    """The loop begins a CUDA-graph step before each forward exactly for these (on CUDA;
    tests/gpu runs reduce-overhead with accumulation and validation)."""
    assert CompileConfig(mode=mode, backend=backend).uses_cuda_graphs is graphs


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
    # count_flops off: its one meta-tensor call of training_step runs outside autocast
    fit(module, cfg(max_steps=1, precision="bf16-mixed", count_flops=False), compile_cfg)
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
    compile_config = CompileConfig(mode="default", backend="aot_eager")
    runs = [
        fit(TrainOnlyToy(n=16, batch_size=b), cfg(max_steps=2), compile_config).telemetry
        for b in (2, 4)
    ]
    for t in runs:
        assert t["compile_time_s"] > 0
        assert t["unique_graphs"] >= 1
        assert t["recompiles"] == 0
    assert runs[1]["unique_graphs"] == runs[0]["unique_graphs"]


class NaNGradToy(ToyTokenModule):
    """A finite loss whose gradient is NaN from step 2 (sqrt'(0) * 0)."""

    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        if batch_idx >= 1:
            out["loss"] = out["loss"] + torch.sqrt(self.head.bias.sum() * 0.0) * 0.0
        return out


def test_non_finite_gradient_under_clipping_names_the_step_and_value() -> None:
    with pytest.raises(NonFiniteGradientError, match=r"gradient norm is nan at step 2") as info:
        fit(NaNGradToy(), cfg(max_steps=4, gradient_clip_norm=1.0))
    assert isinstance(info.value, NonFiniteLossError)  # callers catching the loss error see it
    assert info.value.kiln_result.global_step == 1  # the progress a failed job reports
    assert [row["step"] for row in info.value.kiln_result.history] == [1]


class NoValidationModule(L.LightningModule):
    """Defines no val_dataloader at all (LightningModule's default raises)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return {"loss": self.layer(x).pow(2).mean(), "num_items": x.shape[0]}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(8, 3)), batch_size=4)


def test_validation_is_optional() -> None:
    result = fit(NoValidationModule(), cfg(max_steps=2))
    assert result.global_step == 2 and result.metrics == {}


class EmptyWindowToy(ToyTokenModule):
    """Every label of the second window is ignored: it has no token to average over."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.data.labels[4:8] = -100  # samples of micro-batches 2 and 3 (batch size 2)


@pytest.mark.parametrize("host_counts", [False, True])
@pytest.mark.parametrize("clip", [None, 1.0])
def test_window_with_zero_items_fails_clearly(host_counts: bool, clip: float | None) -> None:
    module = EmptyWindowToy(n=16, batch_size=2)
    if host_counts:
        module.count_items = lambda batch: int((batch["labels"] != -100).sum())
    with pytest.raises(EmptyWindowError, match="step 2 counts 0 items") as info:
        fit(module, cfg(max_steps=4, accumulate_grad_batches=2, gradient_clip_norm=clip))
    assert info.value.kiln_result.global_step >= 1


def test_logged_lr_is_the_rate_the_step_used() -> None:
    module = ToyTokenModule(scheduler=True)  # StepLR: lr 0.1 for steps 1-3, then 0.05
    result = fit(module, cfg(max_steps=5))
    assert [row["train/lr"] for row in result.history] == pytest.approx([0.1, 0.1, 0.1, 0.05, 0.05])


class OwnBatchesToy(ToyTokenModule):
    """Trains on a batch sampler of its own (length buckets do this): batches of 2, 3 and 1."""

    BATCHES = ((3, 1), (0, 2, 5), (4,))

    def __init__(self) -> None:
        super().__init__(n=6)
        self.seen: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        if batch["input_ids"].device.type != "meta":  # the FLOP count's run on stand-ins
            self.seen.append(batch["input_ids"].clone())
        return super().training_step(batch, batch_idx)

    def train_dataloader(self):
        return DataLoader(self.data, batch_sampler=[list(b) for b in self.BATCHES])


def test_a_modules_own_batch_sampler_is_kept_batch_for_batch() -> None:
    module = OwnBatchesToy()
    with pytest.warns(UserWarning, match="custom batch_sampler"):
        fit(module, cfg(max_steps=3))
    expected = [module.data.ids[list(b)] for b in OwnBatchesToy.BATCHES]
    assert [s.shape[0] for s in module.seen] == [2, 3, 1]
    assert all(torch.equal(s, e) for s, e in zip(module.seen, expected, strict=True))


class MiscountingToy(ToyTokenModule):
    """Reports one item more than its ``count_items`` counts."""

    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        return {**out, "num_items": out["num_items"] + 1}


def test_a_num_items_that_count_items_disagrees_with_is_refused_before_the_first_update() -> None:
    module = MiscountingToy()
    before = weights(module)
    with pytest.raises(ValueError, match=r"reported num_items=\d+ but count_items\(batch\)"):
        fit(module, cfg(max_steps=2))
    assert all(torch.equal(before[k], v) for k, v in weights(module).items())


class MetaCountingToy(ToyTokenModule):
    """Counts the FLOP count's runs of ``training_step`` on meta stand-ins."""

    def __init__(self) -> None:
        super().__init__()
        self.meta_runs = 0

    def training_step(self, batch, batch_idx):
        self.meta_runs += batch["input_ids"].device.type == "meta"
        return super().training_step(batch, batch_idx)


def test_the_first_step_takes_its_one_off_figures_once() -> None:
    module = MetaCountingToy()
    telemetry = fit(module, cfg(max_steps=3)).telemetry
    assert module.meta_runs == 1
    assert telemetry["flops_per_step"] > 0
    params = sum(p.numel() * p.element_size() for p in module.parameters())
    assert telemetry["grad_bytes"] == params  # every parameter has its gradient at step 1
