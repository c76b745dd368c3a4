import itertools
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
