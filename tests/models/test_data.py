import re

import numpy as np
import pytest
import torch
from conftest import tiny_data

from kiln.models.data import (
    IGNORE_INDEX,
    CausalLMData,
    ImageClassificationData,
    TextClassificationData,
    generate_sentiment,
)
from kiln.models.testing import tiny_model


def test_generated_sentiment_is_deterministic_and_balanced():
    a, b = generate_sentiment(200, seed=3), generate_sentiment(200, seed=3)
    assert a == b
    assert generate_sentiment(200, seed=4) != a
    assert sum(a["label"]) == 100
    assert any(" not " in t or "hardly" in t for t in a["text"])
    assert any(t.startswith("i expected") for t in a["text"])


def test_bag_of_words_cannot_solve_the_generated_sentiment():
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression

    train, val = generate_sentiment(4000, seed=0), generate_sentiment(1000, seed=1)
    vec = CountVectorizer(ngram_range=(1, 1))
    clf = LogisticRegression(max_iter=2000).fit(vec.fit_transform(train["text"]), train["label"])
    accuracy = clf.score(vec.transform(val["text"]), val["label"])
    assert accuracy < 0.8, f"a bag of words reaches {accuracy:.2f}: the data needs more context"


def test_text_batches_have_one_static_shape_and_val_padding_is_ignored():
    module = tiny_model("bert-tiny-cls", data=True)
    data = module.data_module
    train = list(data.train_dataloader())
    assert len(train) == 64 // 8  # drop_last
    assert {tuple(b["input_ids"].shape) for b in train} == {(8, 32)}
    val = list(data.val_dataloader())  # 40 rows -> 5 full batches of 8
    assert {tuple(b["input_ids"].shape) for b in val} == {(8, 32)}
    data.val_batch_size = 16  # 40 rows -> 48: 8 padding rows with ignored labels
    val = list(data.val_dataloader())
    assert {tuple(b["input_ids"].shape) for b in val} == {(16, 32)}
    labels = torch.cat([b["labels"] for b in val])
    assert (labels == IGNORE_INDEX).sum() == 8 and (labels[:40] != IGNORE_INDEX).all()


def test_validation_batches_are_read_a_batch_at_a_time(monkeypatch):
    """The padded validation set reads each batch's rows in one read of the HF dataset
    (``__getitems__``: one Arrow slice), not one lookup per row, and yields the same batches."""
    import datasets

    module = tiny_model("bert-tiny-cls", data=True)
    data = module.data_module
    data.val_batch_size = 16  # 40 rows -> 48: the last batch holds 8 padding rows
    data.setup()
    rows = [data.val_set[i] for i in range(len(data.val_set))]
    reads = {"rows": 0, "batches": 0}
    for name, kind in (("__getitem__", "rows"), ("__getitems__", "batches")):
        original = getattr(datasets.Dataset, name)

        def counted(self, key, *args, _original=original, _kind=kind, **kwargs):
            reads[_kind] += _kind == "batches" or isinstance(key, int)  # a row, or a batch
            return _original(self, key, *args, **kwargs)

        monkeypatch.setattr(datasets.Dataset, name, counted)
    val = list(data.val_dataloader())
    assert reads == {"rows": 1, "batches": 3}, reads  # 3 batches; the padding copies row 0
    labels = torch.cat([b["labels"] for b in val])
    assert (labels[40:] == IGNORE_INDEX).all()
    for key in ("input_ids", "attention_mask", "labels"):
        expected = torch.stack([row[key] for row in rows])
        assert torch.equal(torch.cat([b[key] for b in val])[:40], expected), key
    assert torch.equal(val[-1]["input_ids"][8:], rows[0]["input_ids"].expand(8, -1))


def test_tokenized_data_is_cached_on_disk(kiln_cache):
    first = tiny_data("text-classification", tokenizer=tiny_model("bert-tiny-cls").tokenizer)
    first.setup()
    second = tiny_data("text-classification", tokenizer=first.tokenizer)
    second.setup()
    assert first.train_set.cache_files == second.train_set.cache_files
    assert first.train_set.cache_files[0]["filename"].startswith(kiln_cache)


def test_causal_lm_labels_ignore_padding_and_count_tokens():
    module = tiny_model("gpt2-tiny-lm", data=True)
    batch = next(iter(module.data_module.train_dataloader()))
    mask = batch["attention_mask"].bool()
    assert (batch["labels"][mask] == batch["input_ids"][mask]).all()
    assert (batch["labels"][~mask] == IGNORE_INDEX).all()
    expected = int(mask[:, 1:].sum())  # label tokens after the shift
    assert int(module.count_items(batch)) == expected
    assert int(module.training_step(batch, 0)["num_items"]) == expected


def test_length_buckets_pad_each_batch_to_a_few_lengths():
    module = tiny_model("bert-tiny-cls")
    data = tiny_data("text-classification", padding="buckets", buckets=(8, 16), max_length=32)
    data.attach(module)
    lengths = {b["input_ids"].shape[1] for b in data.train_dataloader()}
    assert lengths <= {8, 16, 32} and lengths
    batch = next(iter(data.train_dataloader()))
    real = batch["attention_mask"].sum(1)
    assert (batch["input_ids"][0, real[0] :] == data.tokenizer.pad_token_id).all()


def test_missing_column_names_the_columns_found(tmp_path):
    path = tmp_path / "reviews.csv"
    path.write_text("review,stars\ngood,pos\nbad,neg\nfine,pos\nawful,neg\n")
    with pytest.raises(ValueError, match=r"'text' is not in the data; columns found: \['review"):
        TextClassificationData(dataset=str(path), val_split=None, val_fraction=0.5).raw()
    data = TextClassificationData(
        dataset="csv",
        data_files={"train": str(path), "validation": str(path)},
        text_column="review",
        label_column="stars",
    )
    assert data.num_labels == 2 and data.label_names == ["neg", "pos"]


def test_integer_labels_count_the_classes_of_both_splits(tmp_path):
    import datasets

    (tmp_path / "train.csv").write_text("text,label\ngood,1\nbad,0\n")
    (tmp_path / "val.csv").write_text("text,label\nfine,2\n")  # the largest class
    files = {"train": str(tmp_path / "train.csv"), "validation": str(tmp_path / "val.csv")}
    assert TextClassificationData(dataset="csv", data_files=files).num_labels == 3
    images = np.zeros((8, 8), dtype=np.uint8).tolist()
    for split, labels in (("train", [1, 0]), ("validation", [2])):
        rows = {"image": [images] * len(labels), "label": labels}
        datasets.Dataset.from_dict(rows).to_parquet(str(tmp_path / f"{split}.parquet"))
    files = {split: str(tmp_path / f"{split}.parquet") for split in ("train", "validation")}
    assert ImageClassificationData(dataset="parquet", data_files=files).num_labels == 3


@pytest.mark.parametrize(
    ("rows", "said"),
    [
        ("good,1\nbad,-1\nfine,0\n", "line 3 (row 1) has label -1; labels are class indices"),
        ("good,1\nbad,\nfine,0\n", "line 3 (row 1) has no label (an empty cell); labels are"),
        ("good,1\nbad,0.5\nfine,0\n", "line 3 (row 1) has label 0.5, not an integer; labels"),
        ("good,pos\nbad,\nfine,neg\n", "line 3 (row 1) has no label (an empty cell); every row"),
    ],
)
def test_a_bad_label_cell_fails_naming_the_file_column_and_line(tmp_path, rows, said):
    """Used to fail mid-training (``IndexError: Target -1 is out of bounds``) or while
    counting classes (``'>' not supported between ... 'float' and 'NoneType'``)."""
    path = tmp_path / "reviews.csv"
    path.write_text("text,label\n" + rows)
    data = TextClassificationData(dataset=str(path), val_split=None, val_fraction=0.34)
    with pytest.raises(
        ValueError, match="^" + re.escape(f"dataset file '{path}', column 'label': {said}")
    ):
        data.raw()


def test_a_label_beyond_the_models_classes_fails_naming_its_line(tmp_path):
    path = tmp_path / "reviews.csv"
    path.write_text("text,label\ngood,1\nbad,0\nfine,7\nok,0\n")
    data = tiny_data("text-classification", dataset=str(path), val_fraction=0.5)
    said = "the model has num_labels=2 but the data (" + repr(str(path)) + ", column 'label') "
    said += f"has labels 0..7 (first: dataset file '{path}', column 'label': line 4 (row 2) "
    said += "has label 7); use num_labels=8 (or None to infer)"
    with pytest.raises(ValueError, match=f"^{re.escape(said)}$"):
        tiny_model("bert-tiny-cls", data=data, num_labels=2)


@pytest.mark.parametrize("content", ["", "text,label\n"])
def test_a_csv_without_rows_fails_naming_it(tmp_path, content):
    """Used to fail as ``Instruction "train" corresponds to no data!``."""
    path = tmp_path / "reviews.csv"
    path.write_text(content)
    with pytest.raises(ValueError, match="^" + re.escape(f"dataset file '{path}' holds no rows")):
        TextClassificationData(dataset=str(path)).raw()


def test_no_generated_rows_fails_naming_the_option():
    """``num_train=0`` fails naming the option and what is valid, before any row is indexed."""
    with pytest.raises(ValueError, match=r"^num_train=0 is not valid: kiln/sentiment needs"):
        TextClassificationData(num_train=0).raw()


def test_label_count_that_does_not_fit_the_data_fails_before_training():
    with pytest.raises(ValueError, match=r"num_labels=1 but the data .* labels 0..1"):
        tiny_model("bert-tiny-cls", data=True, num_labels=1)
    with pytest.raises(ValueError, match="num_classes=5 but 'digits' has 10 classes"):
        tiny_model("resnet-tiny", data=True, num_classes=5)
    assert tiny_model("bert-tiny-cls", data=True).num_labels == 2  # inferred


def test_tokenizer_larger_than_the_embedding_fails_clearly():
    with pytest.raises(ValueError, match="tokenizer has 30522 tokens but the model's embedding"):
        tiny_model("gpt2-tiny-lm", data=True, config_overrides={"vocab_size": 1000})
    with pytest.raises(ValueError, match="max_length=256 exceeds the model's 128 positions"):
        tiny_model("gpt2-tiny-lm", data=CausalLMData(num_train=16, num_val=8, max_length=256))


def test_loader_workers_do_not_deadlock():
    module = tiny_model("bert-tiny-cls", data=True)
    module.data_module.num_workers = 2
    loader = module.data_module.train_dataloader()
    loader.timeout = 60  # a deadlocked worker fails the test instead of hanging it
    for _ in range(2):  # persistent workers survive a second epoch
        assert sum(b["input_ids"].shape[0] for b in loader) == 64


def test_digits_are_upscaled_and_replicated_to_the_model_input():
    module = tiny_model("vit-tiny", data=True)
    assert module.input_size == (3, 32, 32)
    batch = next(iter(module.data_module.train_dataloader()))
    pixels = batch["pixel_values"]
    assert pixels.shape == (16, 3, 32, 32) and batch["labels"].shape == (16,)
    mean, std = module.data_config["mean"], module.data_config["std"]
    grey = [pixels[:, c] * std[c] + mean[c] for c in range(3)]  # undo the normalization
    assert np.allclose(grey[0], grey[1], atol=1e-5) and np.allclose(grey[0], grey[2], atol=1e-5)
    val = list(module.data_module.val_dataloader())  # 360 rows -> 12 batches of 32, padded
    assert {tuple(b["pixel_values"].shape) for b in val} == {(32, 3, 32, 32)}
    assert sum(int((b["labels"] != IGNORE_INDEX).sum()) for b in val) == 360


def test_image_data_must_be_attached_before_loading():
    with pytest.raises(RuntimeError, match="attach"):
        ImageClassificationData().train_dataloader()


def test_a_kiln_data_module_is_one_the_lightning_trainer_takes(tmp_path):
    import lightning as L

    module = tiny_model("bert-tiny-cls", data=True)
    data = module.data_module
    assert isinstance(data, L.LightningDataModule)
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=2,
        default_root_dir=tmp_path,
    )
    module.data_module = None  # the Trainer, not the module, hands out the batches
    trainer.validate(module, datamodule=data, verbose=False)
    assert data.trainer is trainer and trainer.num_val_batches == [2]
