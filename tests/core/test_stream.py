"""``fit`` on a stream: a stateful loader's position goes into every checkpoint, so a resume
continues with the batches an uninterrupted run trains on; what cannot resume is refused."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from torch.utils.data import DataLoader, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader
from toy import ToySequences, ToyTokenModule, weights
from trainers import trainer_config

from kiln.core import fit
from kiln.core.loop.stream import STATE_KEY, restore_stream


class Endless(IterableDataset):
    """The toy's rows in an endless, position-dependent order, with a state of one number."""

    def __init__(self, data: ToySequences) -> None:
        self.data, self.position = data, 0

    def __iter__(self):
        while True:
            index = (self.position * 7 + self.position // len(self.data)) % len(self.data)
            self.position += 1
            yield self.data[index]

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


class StreamModule(ToyTokenModule):
    def __init__(self, stateful: bool = True, workers: int = 0) -> None:
        super().__init__(n=13, batch_size=3, optimizer="adamw", lr=0.05)
        self.stateful, self.workers = stateful, workers

    def train_dataloader(self):
        loader = StatefulDataLoader if self.stateful else DataLoader
        return loader(Endless(self.data), batch_size=self.batch_size, num_workers=self.workers)


# two loader workers: about 25 s (their start-up), in make test-all
@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.long)])
def test_a_resumed_stream_trains_on_what_the_uninterrupted_run_does(
    tmp_path: Path, workers: int
) -> None:
    """Stopped at step 4 (its checkpoint), resumed to step 9: the losses of steps 5..9 and
    the final weights are the uninterrupted run's, bit for bit."""
    common = {"accumulate_grad_batches": 2, "checkpoint_dir": str(tmp_path / "run")}
    plain_module = StreamModule(workers=workers)
    plain = fit(plain_module, trainer_config(max_steps=9, accumulate_grad_batches=2))
    fit(StreamModule(workers=workers), trainer_config(max_steps=4, **common))
    resumed_module = StreamModule(workers=workers)
    resumed = fit(resumed_module, trainer_config(max_steps=9, resume="auto", **common))
    assert [row["step"] for row in resumed.history] == list(range(1, 10))
    assert resumed.history == plain.history  # steps 5..9 trained by the resumed process
    after, want = weights(resumed_module), weights(plain_module)
    assert all(after[k].equal(want[k]) for k in want)


def test_a_stream_without_a_position_is_refused() -> None:
    with pytest.raises(TypeError, match=r"load_state_dict\(\), e\.g\. torchdata"):
        fit(StreamModule(stateful=False), trainer_config())


def test_a_stream_cannot_end_a_run_by_epochs() -> None:
    with pytest.raises(ValueError, match=r"trainer\.max_epochs=1 cannot end a run on a stream"):
        fit(StreamModule(), trainer_config(max_epochs=1))


def test_a_checkpoint_of_another_reading_is_refused(tmp_path: Path) -> None:
    fabric = SimpleNamespace(world_size=1, global_rank=0)
    loader = StatefulDataLoader(Endless(ToySequences(4)), batch_size=2)
    saved = {"world_size": 2, "num_workers": 0, "ranks": [{}, {}]}
    with pytest.raises(
        ValueError, match="read by 2 processes x 0 DataLoader workers, this run has 1 x 0"
    ):
        restore_stream(fabric, loader, {STATE_KEY: saved}, tmp_path)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="holds no position of the training stream"):
        restore_stream(fabric, loader, {}, tmp_path)  # type: ignore[arg-type]
