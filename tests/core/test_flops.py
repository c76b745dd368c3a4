"""FLOPs per step, achieved FLOP/s and MFU in every run's telemetry."""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from kiln.core import TrainerConfig, fit
from kiln.core.telemetry import flops as flops_module
from kiln.core.telemetry.flops import peak_flops_per_s

B, IN, HIDDEN, OUT = 4, 8, 16, 3


class TwoLinear(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(IN, HIDDEN), torch.nn.Dropout(0.5), torch.nn.Linear(HIDDEN, OUT)
        )
        g = torch.Generator().manual_seed(1)
        self.data = TensorDataset(torch.randn(32, IN, generator=g), torch.randint(0, OUT, (32,)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return {"loss": F.cross_entropy(self.net(x), y), "num_items": x.shape[0]}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=B, shuffle=True, drop_last=True)


def analytic_micro_batch_flops() -> int:
    matmul = lambda m, k, n: 2 * m * k * n  # noqa: E731
    forward = matmul(B, IN, HIDDEN) + matmul(B, HIDDEN, OUT)
    # backward: both layers' weight gradients, and the input gradient of the second only
    # (the batch needs none)
    backward = matmul(B, IN, HIDDEN) + 2 * matmul(B, HIDDEN, OUT)
    return forward + backward


def run(accumulate: int = 1, **kw):
    module = TwoLinear()
    trainer = TrainerConfig(
        max_steps=4, accumulate_grad_batches=accumulate, accelerator="cpu", progress=False, **kw
    )
    return module, fit(module, trainer).telemetry


@pytest.mark.parametrize("accumulate", [1, 2])
def test_flops_per_step_is_the_analytic_matmul_count_and_mfu_is_none_on_cpu(accumulate):
    _, telemetry = run(accumulate)
    assert telemetry["flops_per_step"] == accumulate * analytic_micro_batch_flops()
    step_s = telemetry["step_time_median_s"]
    assert telemetry["achieved_flops_per_s"] == pytest.approx(telemetry["flops_per_step"] / step_s)
    assert telemetry["mfu"] is None  # kiln knows no peak for a CPU


class BiasedConv(TwoLinear):
    """A convolution with a bias: on meta, it checks its input's dtype against the bias's."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(1, 2, 3)

    def training_step(self, batch, batch_idx):
        x, _ = batch
        return {"loss": self.conv(x[:, None]).mean(), "num_items": x.shape[0]}


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=["float64", "bf16"])
def test_the_batch_follows_the_weights_dtype_on_meta(dtype):
    """A float32 batch against float64 (64-true) or bf16 weights: the meta pass converts
    the batch's floating tensors, as Fabric converts the real step's inputs."""
    module = BiasedConv()
    batch = next(iter(module.train_dataloader()))
    want = flops_module.count_micro_batch_flops(module, batch)
    assert want is not None
    assert flops_module.count_micro_batch_flops(module.to(dtype), batch) == want


def test_counting_flops_changes_no_weight_and_no_random_stream():
    counted, _ = run(count_flops=True)
    plain, telemetry = run(count_flops=False)
    assert telemetry["flops_per_step"] is None
    for (name, a), b in zip(counted.state_dict().items(), plain.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_peak_flops_come_from_the_table_by_device_name_and_precision(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 PCIe")
    cuda = torch.device("cuda", 0)
    assert peak_flops_per_s(cuda, "bf16-mixed") == 756e12
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    assert peak_flops_per_s(cuda, "16-mixed") == 312e12
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "highest")
    assert peak_flops_per_s(cuda, "32-true") == 19.5e12
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    assert peak_flops_per_s(cuda, "32-true") == 156e12
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    assert peak_flops_per_s(cuda, "bf16-mixed") is None
    assert peak_flops_per_s(torch.device("cpu"), "bf16-mixed") is None


def test_mfu_divides_achieved_flops_by_the_peak_of_every_rank():
    out = flops_module.flops_telemetry(100, 2, 4, 0.5, peak=1000.0)
    assert out == {"flops_per_step": 800, "achieved_flops_per_s": 1600.0, "mfu": 0.4}


class ReadsValues(TwoLinear):
    """A step that reads a tensor's value, which meta tensors do not have."""

    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        self.last_loss = out["loss"].item()
        return out


class AssertsValues(TwoLinear):
    def training_step(self, batch, batch_idx):
        x, _ = batch
        assert x.device.type == "cpu", "a\nmulti-line\nmessage"  # true for real batches
        return super().training_step(batch, batch_idx)


def flops_records(caplog) -> list:
    return [r for r in caplog.records if r.name == "kiln.core.telemetry.flops"]


def test_a_step_that_reads_values_costs_one_info_line_and_no_warning(caplog, recwarn):
    caplog.set_level("INFO", logger="kiln.core.telemetry.flops")
    module = ReadsValues()
    telemetry = fit(module, TrainerConfig(max_steps=3, accelerator="cpu", progress=False))
    assert telemetry.telemetry["flops_per_step"] is None
    assert module.last_loss > 0  # the real steps ran
    (record,) = flops_records(caplog)  # once per run, not once per step
    assert record.levelname == "INFO" and "\n" not in record.getMessage()
    assert "ReadsValues" in record.getMessage() and "count_flops = False" in record.getMessage()
    assert not [w for w in recwarn if "FLOP" in str(w.message)]


def test_count_flops_false_on_the_module_skips_counting_silently(caplog):
    caplog.set_level("INFO", logger="kiln.core.telemetry.flops")
    module = ReadsValues()
    module.count_flops = False
    result = fit(module, TrainerConfig(max_steps=1, accelerator="cpu", progress=False))
    assert result.telemetry["flops_per_step"] is None
    assert not flops_records(caplog)


def test_any_failure_on_meta_is_one_line_and_an_unexpected_one_a_warning(caplog):
    caplog.set_level("INFO", logger="kiln.core.telemetry.flops")
    module = AssertsValues()
    batch = next(iter(module.train_dataloader()))
    assert flops_module.count_micro_batch_flops(module, batch) is None
    (record,) = flops_records(caplog)
    assert "\n" not in record.getMessage() and "AssertionError: a" in record.getMessage()

    class Unexpected(TwoLinear):
        def training_step(self, batch, batch_idx):
            raise ValueError("not about\nthe device")

    caplog.clear()
    assert flops_module.count_micro_batch_flops(Unexpected(), batch) is None
    (record,) = flops_records(caplog)
    assert record.levelname == "WARNING" and "\n" not in record.getMessage()


def test_blocks_in_checkpoint_wrappers_count_their_flops_once():
    """torch's checkpoint_wrapper recomputes each block in the backward; the model's FLOPs
    (what MFU divides) stay those of one forward and backward."""
    from toy import ToyBlocksModule

    def flops_per_step(checkpointed: bool):
        trainer = TrainerConfig(
            max_steps=1, accelerator="cpu", progress=False, activation_checkpointing=checkpointed
        )
        telemetry = fit(ToyBlocksModule(blocks=3), trainer).telemetry
        assert (telemetry["activation_checkpointing"] is not None) == checkpointed
        return telemetry["flops_per_step"]

    plain = flops_per_step(False)
    assert plain is not None and flops_per_step(True) == plain
