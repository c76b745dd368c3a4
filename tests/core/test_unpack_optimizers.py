import pytest
import torch

from kiln.core import unpack_optimizers


def _optimizer():
    return torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)


def test_an_optimizer_alone_has_no_scheduler():
    opt = _optimizer()
    assert unpack_optimizers(opt) == (opt, None)


def test_lightning_dicts_give_the_optimizer_and_the_scheduler():
    opt = _optimizer()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    assert unpack_optimizers({"optimizer": opt}) == (opt, None)
    assert unpack_optimizers({"optimizer": opt, "lr_scheduler": sched}) == (opt, sched)
    per_step = {"scheduler": sched, "interval": "step", "frequency": 1, "name": "lr"}
    assert unpack_optimizers({"optimizer": opt, "lr_scheduler": per_step}) == (opt, sched)


@pytest.mark.parametrize(
    ("key", "value"), [("interval", "epoch"), ("frequency", 2), ("monitor", "val/loss")]
)
def test_a_schedule_kiln_would_step_differently_is_rejected(key, value):
    opt = _optimizer()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    config = {"optimizer": opt, "lr_scheduler": {"scheduler": sched, key: value}}
    with pytest.raises(ValueError, match=rf"lr_scheduler\['{key}'\].*interval 'step', frequency 1"):
        unpack_optimizers(config)


def test_anything_else_is_a_type_error():
    with pytest.raises(TypeError, match="must return an optimizer"):
        unpack_optimizers([_optimizer()])
    with pytest.raises(TypeError, match="got dict"):
        unpack_optimizers({"lr_scheduler": None})
