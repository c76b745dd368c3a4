"""Data identity through ``kiln.core.fit`` (a user without kiln-train): every checkpoint
records the data module's fingerprint (entry ``"data"``, registered by the data module
through the module's ``checkpoint_state()``), and a resume on changed data is refused with a
ValueError naming the file, unless the data module allows it. kiln-train's refusal, before
any W&B run, is ``tests/experiments/test_data_identity.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainers import trainer_config

from kiln.core import fit
from kiln.models.data import CausalLMData, DataModule, TextClassificationData
from kiln.models.data.fingerprint import DataChangedError, changes, fingerprint
from kiln.models.testing import tiny_model

ROWS = [("a fine film", 1), ("awful", 0), ("great fun", 1), ("dull and slow", 0)] * 6


def write_csv(path: Path, flip: bool = False) -> Path:
    lines = [f"{text},{1 - label if flip else label}" for text, label in ROWS]
    path.write_text("text,label\n" + "\n".join(lines) + "\n")
    return path


def csv_module(path: Path, **kw):
    data = TextClassificationData(
        dataset="csv", data_files=str(path), val_split=None, val_fraction=0.25, batch_size=4,
        max_length=16, **kw,
    )  # fmt: skip
    return tiny_model("bert-tiny-cls", data=data, num_labels=2)


def trainer(tmp: Path, max_steps: int, **kw):
    return trainer_config(
        max_steps=max_steps, checkpoint_dir=str(tmp / "ckpt"), checkpoint_every_n_steps=2,
        limit_val_batches=1, seed=3, **kw,
    )  # fmt: skip


def test_a_changed_local_file_is_refused_by_name_unless_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    csv = write_csv(tmp_path / "reviews.csv")
    fit(csv_module(csv), trainer(tmp_path, 2))
    saved = torch.load(tmp_path / "ckpt" / "step-00000002.ckpt" / "meta.pt", weights_only=True)
    (path, record), = saved["data"]["files"].items()  # fmt: skip
    assert path == str(csv) and record["split"] == "train"
    assert record["checksum"].startswith("xxh3_128:") and record["size"] > 0
    assert saved["data"]["splits"]["train"]["rows"] == 18  # 24 rows, a quarter held out
    assert fit(csv_module(csv), trainer(tmp_path, 3, resume="auto")).global_step == 3

    write_csv(csv, flip=True)  # every label flipped: the same size, other bytes
    with pytest.raises(DataChangedError) as refused:
        fit(csv_module(csv), trainer(tmp_path, 4, resume="auto"))
    assert isinstance(refused.value, ValueError)
    message = str(refused.value)
    assert f"training file {csv} changed (same size" in message, message
    assert "data.allow_changed=true" in message

    capsys.readouterr()
    allowed = fit(csv_module(csv, allow_changed=True), trainer(tmp_path, 4, resume="auto"))
    assert allowed.global_step == 4
    assert "resuming on changed data (allow_changed=true): training file" in capsys.readouterr().out


def test_a_checkpoint_without_the_entry_resumes_and_says_so_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    csv = write_csv(tmp_path / "reviews.csv")
    with monkeypatch.context() as patch:  # a kiln that recorded no data
        patch.setattr(DataModule, "checkpoint_state", lambda self: {})
        fit(csv_module(csv), trainer(tmp_path, 2))
    saved = torch.load(tmp_path / "ckpt" / "step-00000002.ckpt" / "meta.pt", weights_only=True)
    assert "data" not in saved
    capsys.readouterr()
    result = fit(csv_module(csv), trainer(tmp_path, 3, resume="auto"))
    assert result.global_step == 3
    out = capsys.readouterr().out
    assert out.count("does not record the data it was trained on") == 1, out


def test_shards_added_removed_and_changed_are_each_named_with_their_rows(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    def shard(name: str, texts: list[str]) -> None:
        pq.write_table(pa.table({"text": texts}), tmp_path / name)

    shard("a.parquet", ["one two", "three"])
    shard("b.parquet", ["four five six"])

    def now() -> dict:
        data = CausalLMData(dataset="parquet", data_files=str(tmp_path / "*.parquet"),
                            packing=True, streaming=True, val_split=None)  # fmt: skip
        data.train_set = sorted(tmp_path.glob("*.parquet"))  # what setup_stream finds
        return fingerprint(data)

    before = now()
    assert before["splits"]["train"] == {"rows": 3, "fingerprint": None}
    shard("a.parquet", ["ONE TWO", "THREE", "seven"])
    (tmp_path / "b.parquet").unlink()
    shard("c.parquet", ["eight"])
    found = changes(before, now())
    assert found[0].startswith(f"training file {tmp_path / 'a.parquet'} changed (")
    assert found[0].endswith("; 2 -> 3 rows)")
    assert found[1:] == [
        f"training file {tmp_path / 'b.parquet'} removed (1 row)",
        f"training file {tmp_path / 'c.parquet'} added (1 row)",
        "training rows 3 -> 4",
    ]


def test_generated_data_is_recorded_by_its_datasets_fingerprint() -> None:
    def now(**kw) -> dict:
        data = TextClassificationData(num_train=16, num_val=8, **kw)
        data.raw()
        return fingerprint(data)

    record = now()
    assert record["files"] == {}
    assert record["splits"]["train"]["rows"] == 16 and record["splits"]["train"]["fingerprint"]
    assert changes(record, now()) == []
    found = changes(record, now(seed=1))  # other rows: another fingerprint
    assert found[0].startswith("the training split's datasets fingerprint ")
