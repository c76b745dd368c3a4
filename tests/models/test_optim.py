import itertools
import logging
import math

import pytest
import torch

from kiln.models.optim import (
    OptimizerConfig,
    SchedulerConfig,
    build_optimizer,
    build_scheduler,
    lr_factor,
    parameter_groups,
)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.lin = torch.nn.Linear(4, 4)
        self.norm = torch.nn.LayerNorm(4)
        self.bn = torch.nn.BatchNorm1d(4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight  # tied


def test_no_weight_decay_on_biases_and_norms():
    net = Net()
    decay, no_decay = parameter_groups(net, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    ids = lambda group: {id(p) for p in group["params"]}  # noqa: E731
    assert ids(decay) == {id(net.emb.weight), id(net.lin.weight)}  # tied weight counted once
    assert ids(no_decay) == {
        id(p) for p in (net.lin.bias, net.norm.weight, net.norm.bias, net.bn.weight, net.bn.bias)
    }


def test_warmup_then_cosine_and_linear_decay():
    cfg = SchedulerConfig(name="cosine", warmup_steps=4, min_lr_ratio=0.1)
    factors = [lr_factor(s, 20, cfg) for s in range(21)]
    assert factors[:4] == pytest.approx([0.2, 0.4, 0.6, 0.8])
    assert factors[4] == pytest.approx(1.0)
    assert factors[12] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert factors[20] == pytest.approx(0.1)
    assert all(a >= b for a, b in itertools.pairwise(factors[4:]))
    linear = SchedulerConfig(name="linear", warmup_ratio=0.1)
    assert linear.warmup(50) == 5
    assert lr_factor(5 + 45 // 2, 50, linear) == pytest.approx(1 - 22 / 45)


def test_scheduler_follows_total_steps_and_needs_it():
    net = Net()
    opt = build_optimizer(net, OptimizerConfig(lr=1.0))
    sched = build_scheduler(opt, SchedulerConfig(name="linear"), total_steps=10)
    for _ in range(5):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="total_steps"):
        build_scheduler(opt, SchedulerConfig(name="cosine"), total_steps=None)


def test_bad_config_values_fail_with_the_valid_choices():
    with pytest.raises(ValueError, match="cosine"):
        SchedulerConfig(name="step")
    with pytest.raises(ValueError, match="adamw"):
        OptimizerConfig(name="sgd")
    assert OptimizerConfig(betas=[0.9, 0.95]).betas == (0.9, 0.95)  # Hydra passes lists


@pytest.mark.parametrize(
    ("config", "warmup"),
    [
        (SchedulerConfig(name="cosine", warmup_steps=50), "scheduler.warmup_steps=50 "),
        (SchedulerConfig(warmup_steps=30), "scheduler.warmup_steps=30 "),
        (SchedulerConfig(warmup_ratio=0.99), "scheduler.warmup_ratio=0.99 (30 steps) "),
    ],
)
def test_a_warmup_as_long_as_the_run_is_said_naming_both_numbers(caplog, config, warmup):
    opt = build_optimizer(Net(), OptimizerConfig(lr=1e-3))
    with caplog.at_level(logging.WARNING, logger="kiln.models.optim"):
        build_scheduler(opt, config, total_steps=30)
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith(warmup) and "run's 30 optimizer steps" in said
    assert "never reaches its peak" in said
    peak = round(100 * lr_factor(29, 30, config))
    assert f"ends at {peak}% of optimizer.lr" in said


def test_a_warmup_shorter_than_the_run_says_nothing(caplog):
    opt = build_optimizer(Net(), OptimizerConfig(lr=1e-3))
    with caplog.at_level(logging.WARNING, logger="kiln.models.optim"):
        build_scheduler(opt, SchedulerConfig(name="cosine", warmup_steps=29), total_steps=30)
        build_scheduler(opt, SchedulerConfig(name="linear", warmup_ratio=0.9), total_steps=30)
    assert caplog.records == []


def _train(net: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: range) -> None:
    for step in steps:
        inputs = torch.arange(8).remainder(10) + step % 3
        loss = net.head(net.norm(net.lin(net.emb(inputs)))).logsumexp(-1).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


@pytest.mark.parametrize("fused", [True, False])
def test_adamw_is_fused_by_default_and_gives_the_per_tensor_loops_update(fused):
    """The default fused kernel makes the same updates as torch's per-tensor AdamW (to float64
    rounding over 20 steps, both decay groups); ``fused=false`` is torch's default."""
    torch.manual_seed(0)
    net = Net().double()
    reference = Net().double()
    reference.load_state_dict(net.state_dict())
    optimizer = build_optimizer(net, OptimizerConfig(lr=1e-2, weight_decay=0.1, fused=fused))
    assert all(group["fused"] is (True if fused else None) for group in optimizer.param_groups)
    assert OptimizerConfig().fused
    loop = torch.optim.AdamW(parameter_groups(reference, 0.1), lr=1e-2, foreach=False, fused=False)
    _train(net, optimizer, range(20))
    _train(reference, loop, range(20))
    for (name, got), want in zip(
        net.state_dict().items(), reference.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14, msg=name)


def test_a_fused_optimizers_checkpoint_resumes_fused_and_bit_exact():
    torch.manual_seed(0)
    net = Net()
    start = {k: v.clone() for k, v in net.state_dict().items()}
    optimizer = build_optimizer(net, OptimizerConfig(lr=1e-2))
    _train(net, optimizer, range(10))
    want = {k: v.clone() for k, v in net.state_dict().items()}

    net.load_state_dict(start)
    optimizer = build_optimizer(net, OptimizerConfig(lr=1e-2))
    _train(net, optimizer, range(5))
    saved = {k: v.clone() for k, v in net.state_dict().items()}, optimizer.state_dict()
    resumed = Net()
    resumed.load_state_dict(saved[0])
    optimizer = build_optimizer(resumed, OptimizerConfig(lr=1e-2, fused=False))
    optimizer.load_state_dict(saved[1])  # the checkpoint's implementation comes back with it
    assert all(group["fused"] for group in optimizer.param_groups)
    _train(resumed, optimizer, range(5, 10))
    for name, value in resumed.state_dict().items():
        assert torch.equal(value, want[name]), name


@pytest.mark.parametrize("name", ["bert-tiny-cls", "gpt2-tiny-lm", "resnet-tiny", "vit-tiny"])
@pytest.mark.parametrize("weight_decay", [0.05, 0.0])
def test_the_decay_groups_are_timms(name, weight_decay):
    """The same split as timm's ``param_groups_weight_decay`` (the reference), parameter by
    parameter and in order, for HF and TIMM models."""
    from timm.optim import param_groups_weight_decay

    from kiln.models import testing as kit

    model = kit.tiny_model(name)
    decay, no_decay = parameter_groups(model, weight_decay)
    reference = param_groups_weight_decay(model, 1.0)  # 1.0: timm keeps two groups
    by_rate = {group["weight_decay"]: [id(p) for p in group["params"]] for group in reference}
    assert [id(p) for p in decay["params"]] == by_rate[1.0]
    assert [id(p) for p in no_decay["params"]] == by_rate[0.0]
    assert decay["weight_decay"] == weight_decay and no_decay["weight_decay"] == 0.0


@pytest.mark.process  # a fresh interpreter's imports are the point
def test_an_hf_models_optimizer_imports_no_timm():
    """timm's import (its model registry, and W&B through timm.utils) cost an HF job
    0.2-0.8 s for a rule of two lines."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from kiln.models.hf import HFSequenceClassifier\n"
        "from kiln.models.optim import OptimizerConfig, build_optimizer\n"
        "model = HFSequenceClassifier(arch='bert', num_labels=2, config_overrides=dict("
        "hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8))\n"
        "build_optimizer(model, OptimizerConfig())\n"
        "print('timm imported:', 'timm' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "timm imported: False" in proc.stdout, proc.stdout
