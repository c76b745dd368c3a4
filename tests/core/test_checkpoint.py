import random
import shutil

import numpy as np
import pytest
import torch
from checkpoint_files import flip_a_byte, truncate
from lightning.fabric import Fabric
from torch import nn
from torch.distributed.checkpoint.filesystem import FileSystemReader

from kiln.core import atomic
from kiln.core.checkpoints import checksum
from kiln.core.checkpoints.load import load_checkpoint
from kiln.core.checkpoints.lookup import checkpoint_path, damage, find_latest_checkpoint
from kiln.core.checkpoints.rng import capture_rng_state, restore_rng_state
from kiln.core.checkpoints.save import save_checkpoint


class Net(nn.Module):
    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.encoder = nn.Linear(3, width)
        self.head = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.encoder(x)))


class OtherNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(3, 4)
        self.head = nn.Linear(4, 2)


@pytest.fixture
def fabric() -> Fabric:
    return Fabric(accelerator="cpu", devices=1)


def _setup(fabric: Fabric, model: nn.Module, lr: float = 0.1):
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9))
    return model, optimizer


def _train_step(fabric: Fabric, model, optimizer) -> None:
    loss = model(torch.randn(5, 3)).square().mean()
    fabric.backward(loss)
    optimizer.step()
    optimizer.zero_grad()


def _saved_model_keys(path) -> list[str]:
    saved = FileSystemReader(path).read_metadata().state_dict_metadata
    return [k.removeprefix("model.") for k in saved if k.startswith("model.")]


def test_checkpoint_path_names_by_step(tmp_path):
    assert checkpoint_path(tmp_path, 42) == tmp_path / "step-00000042.ckpt"
    with pytest.raises(ValueError, match="step=-1"):
        checkpoint_path(tmp_path, -1)


def test_round_trip_restores_objects_and_returns_plain_values(fabric, tmp_path):
    torch.manual_seed(0)
    model, optimizer = _setup(fabric, Net())
    _train_step(fabric, model, optimizer)
    path = save_checkpoint(
        fabric, tmp_path, 7, {"model": model, "optimizer": optimizer, "global_step": 7}, 2
    )
    assert path == checkpoint_path(tmp_path, 7)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    expected_momentum = [s["momentum_buffer"].clone() for s in optimizer.state.values()]

    torch.manual_seed(1)
    model2, optimizer2 = _setup(fabric, Net())
    remainder = load_checkpoint(fabric, path, {"model": model2, "optimizer": optimizer2})
    assert remainder["global_step"] == 7
    assert set(remainder["rng"]) >= {"python", "numpy", "torch"}  # this rank's state, not a list
    for key, value in model2.state_dict().items():
        assert torch.equal(value, expected[key]), key
    momentum = [s["momentum_buffer"] for s in optimizer2.state.values()]
    assert all(torch.equal(a, b) for a, b in zip(momentum, expected_momentum, strict=True))


def test_crash_between_write_and_rename_keeps_previous_checkpoint(fabric, tmp_path, monkeypatch):
    model, optimizer = _setup(fabric, Net())
    state = {"model": model, "optimizer": optimizer}
    first = save_checkpoint(fabric, tmp_path, 1, state, keep_last_k=3)

    def crash(*_):
        raise OSError("simulated crash before the rename")

    with monkeypatch.context() as patch:
        patch.setattr(atomic.os, "replace", crash)
        with pytest.raises(OSError, match="simulated crash"):
            save_checkpoint(fabric, tmp_path, 2, state, keep_last_k=3)
    temp = tmp_path / "step-00000002.ckpt.tmp"
    assert temp.is_dir()  # the full write happened, only the rename did not
    assert not checkpoint_path(tmp_path, 2).exists()
    assert find_latest_checkpoint(tmp_path) == first

    third = save_checkpoint(fabric, tmp_path, 3, state, keep_last_k=3)
    assert find_latest_checkpoint(tmp_path) == third
    assert not temp.exists()  # leftovers of the interrupted save are cleaned up


def test_find_latest_skips_truncated_files_and_orders_by_step(fabric, tmp_path):
    assert find_latest_checkpoint(tmp_path / "missing") is None
    model, _ = _setup(fabric, Net())
    good = save_checkpoint(fabric, tmp_path, 9, {"model": model}, keep_last_k=5)
    save_checkpoint(fabric, tmp_path, 10, {"model": model}, keep_last_k=5)
    # step 100 sorts after step 10 numerically; step 10 is truncated
    shutil.copytree(checkpoint_path(tmp_path, 10), checkpoint_path(tmp_path, 100))
    shutil.copytree(checkpoint_path(tmp_path, 10), tmp_path / "step-00000200.ckpt.tmp")
    truncate(checkpoint_path(tmp_path, 10))
    with pytest.warns(UserWarning, match="damaged checkpoint .*step-00000010.ckpt"):
        assert find_latest_checkpoint(tmp_path) == good  # step 100 is no file this run wrote


def test_keeps_last_k(fabric, tmp_path):
    model, _ = _setup(fabric, Net())
    for step in range(1, 6):
        save_checkpoint(fabric, tmp_path, step, {"model": model}, keep_last_k=2)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["run.json", "step-00000004.ckpt", "step-00000005.ckpt"]
    with pytest.raises(ValueError, match="keep_last_k=0"):
        save_checkpoint(fabric, tmp_path, 6, {"model": model}, keep_last_k=0)


def test_compiled_and_eager_checkpoints_are_interchangeable(fabric, tmp_path):
    torch.manual_seed(0)
    eager, _ = _setup(fabric, Net())
    torch.manual_seed(1)
    compiled, compiled_opt = _setup(fabric, torch.compile(Net(), backend="aot_eager"))
    _train_step(fabric, compiled, compiled_opt)  # runs the compiled graph

    eager_path = save_checkpoint(fabric, tmp_path / "eager", 1, {"model": eager}, 1)
    compiled_path = save_checkpoint(fabric, tmp_path / "compiled", 1, {"model": compiled}, 1)
    keys = _saved_model_keys(eager_path)
    assert _saved_model_keys(compiled_path) == keys
    assert not any("_orig_mod" in k for k in keys)

    eager_values = {k: v.clone() for k, v in eager.state_dict().items()}
    compiled_values = {k: v.clone() for k, v in compiled.state_dict().items()}
    load_checkpoint(fabric, compiled_path, {"model": eager})
    load_checkpoint(fabric, eager_path, {"model": compiled})
    for key in keys:
        assert torch.equal(eager.state_dict()[key], compiled_values[key]), key
        assert torch.equal(compiled.state_dict()[key], eager_values[key]), key


def test_bare_and_nested_compiled_modules_save_without_prefix(fabric, tmp_path):
    nested = Net()
    nested.encoder = torch.compile(nested.encoder, backend="aot_eager")
    bare = torch.compile(Net(), backend="aot_eager")
    for name, module in (("nested", nested), ("bare", bare)):
        path = save_checkpoint(fabric, tmp_path / name, 1, {"model": module}, 1)
        assert sorted(_saved_model_keys(path)) == sorted(Net().state_dict()), name
        assert any("_orig_mod" in k for k in module.state_dict()), "hook must be removed"
        # and the prefix-free checkpoint loads back into the compiled module
        load_checkpoint(fabric, path, {"model": module})


def test_loads_checkpoints_with_orig_mod_keys(fabric, tmp_path):
    source = Net()
    path = tmp_path / "foreign.ckpt"
    prefixed = {f"_orig_mod.{k}": v for k, v in source.state_dict().items()}
    torch.save({"model": prefixed, "global_step": 3}, path)
    target = Net()
    assert load_checkpoint(fabric, path, {"model": target}) == {"global_step": 3}
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value)


def test_mismatched_model_fails_with_clear_message(fabric, tmp_path):
    path = save_checkpoint(fabric, tmp_path, 5, {"model": _setup(fabric, Net())[0]}, 1)
    other, _ = _setup(fabric, OtherNet())
    with pytest.raises(RuntimeError) as error:
        load_checkpoint(fabric, path, {"model": other})
    message = str(error.value)
    assert str(path) in message
    assert "missing keys: body.weight, body.bias" in message
    assert "unexpected keys: encoder.weight, encoder.bias" in message

    wider, _ = _setup(fabric, Net(width=8))
    with pytest.raises(RuntimeError, match=rf"(?si){path}.*size mismatch"):
        load_checkpoint(fabric, path, {"model": wider})
    with pytest.raises(KeyError, match="has no \\['scheduler'\\]"):
        load_checkpoint(fabric, path, {"model": Net(), "scheduler": object()})
    with pytest.raises(FileNotFoundError, match=r"nope.ckpt"):
        load_checkpoint(fabric, tmp_path / "nope.ckpt", {"model": Net()})


def _draws() -> tuple:
    return (random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist())


def test_rng_round_trip_reproduces_draws():
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.randn()  # leave a cached gaussian in numpy's state
    state = capture_rng_state()
    first = _draws()
    assert _draws() != first
    restore_rng_state(state)
    assert _draws() == first
    with pytest.raises(ValueError, match="missing 'numpy'"):
        restore_rng_state({"python": state["python"], "torch": state["torch"]})


def test_rng_state_survives_checkpoint(fabric, tmp_path):
    model, _ = _setup(fabric, Net())
    torch.manual_seed(11)
    path = save_checkpoint(fabric, tmp_path, 1, {"model": model}, 1)
    first = _draws()
    _draws()
    rng = load_checkpoint(fabric, path, {"model": model})["rng"]
    restore_rng_state(rng)
    assert _draws() == first
    # the checkpoint is plain tensors and values
    assert len(torch.load(path / "meta.pt", weights_only=True)["rng"]) == 1


def test_run_json_records_the_checksum_of_each_file_on_disk(fabric, tmp_path):
    """The checksum is the XXH3-128 of the checkpoint renamed into place (each file's path
    and bytes, in path order), for step and named checkpoints."""
    import xxhash

    from kiln.core.checkpoints.rundir import read_run_file

    model, optimizer = _setup(fabric, Net())
    state = {"model": model, "optimizer": optimizer}
    _train_step(fabric, model, optimizer)
    first = save_checkpoint(fabric, tmp_path, 1, state, keep_last_k=2)
    _train_step(fabric, model, optimizer)
    second = save_checkpoint(fabric, tmp_path, 2, state, keep_last_k=2)
    best = save_checkpoint(fabric, tmp_path, 2, state, keep_last_k=2, name="best.ckpt")

    def on_disk(path):
        hasher = xxhash.xxh3_128()
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            hasher.update(str(file.relative_to(path)).encode() + b"\0" + file.read_bytes())
        return "xxh3_128:" + hasher.hexdigest()

    recorded = read_run_file(tmp_path)
    assert recorded.checkpoints == {first.name: on_disk(first), second.name: on_disk(second)}
    assert recorded.named == {best.name: on_disk(best)}
    assert on_disk(first) != on_disk(second)


def test_a_run_directory_of_an_earlier_release_keeps_resuming_on_its_sha256(fabric, tmp_path):
    """run.json files written before XXH3 hold bare sha256 digests: an intact checkpoint
    still passes, a changed one is still named damaged, and the next save records XXH3."""
    import dataclasses

    from kiln.core.checkpoints.rundir import read_run_file, write_run_file

    model, optimizer = _setup(fabric, Net())
    state = {"model": model, "optimizer": optimizer}
    _train_step(fabric, model, optimizer)
    first = save_checkpoint(fabric, tmp_path, 1, state, keep_last_k=3)
    legacy = checksum.checksum_of(first, "sha256")
    assert legacy == checksum.checksum_of(first, "sha256") and ":" not in legacy
    write_run_file(
        tmp_path, dataclasses.replace(read_run_file(tmp_path), checkpoints={first.name: legacy})
    )
    assert damage(first) is None
    assert find_latest_checkpoint(tmp_path) == first
    _train_step(fabric, model, optimizer)
    second = save_checkpoint(fabric, tmp_path, 2, state, keep_last_k=3)
    recorded = read_run_file(tmp_path).checkpoints
    assert recorded[first.name] == legacy and recorded[second.name].startswith("xxh3_128:")
    flip_a_byte(first)  # a byte of tensor data, with checksums.json taken anew: only
    checksum.write_checksums(first)  # run.json's sha256 can tell
    assert "its checksum does not match" in damage(first)
