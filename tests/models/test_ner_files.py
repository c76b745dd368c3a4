"""Your own NER data from local files: string tags become a ``ClassLabel`` (the model's
label names), integer tags need names and are refused without them when the model is
built, and the entity metrics' seqeval mode is a model argument."""

from __future__ import annotations

import json

import pytest
import torch

import kiln.models as km
from kiln.models.data import IGNORE_INDEX, TokenClassificationData
from kiln.models.metrics import load_metric

ROWS = [
    {"tokens": ["Ann", "Lee", "visited", "Oslo"], "tags": ["B-PER", "I-PER", "O", "B-LOC"]},
    {"tokens": ["Oslo", "is", "cold"], "tags": ["B-LOC", "O", "O"]},
    {"tokens": ["Bo", "met", "Ann", "Lee"], "tags": ["B-PER", "O", "B-PER", "I-PER"]},
] * 4
NAMES = ["O", "B-LOC", "B-PER", "I-PER"]  # O first, then sorted


def write(tmp_path, rows, name="ner.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def ner_data(dataset: str, **kwargs) -> TokenClassificationData:
    args = dict(batch_size=4, max_length=16, val_fraction=0.25, cache_dir=None)
    return TokenClassificationData(dataset=dataset, **{**args, **kwargs})


def test_string_tags_in_a_local_file_become_the_model_s_label_names(tmp_path):
    data = ner_data(write(tmp_path, ROWS))
    module = km.create_model("bert-tiny-token-cls", data=data)
    assert data.label_names == NAMES and data.num_labels == 4
    assert module.model.config.id2label == dict(enumerate(NAMES))
    batch = next(iter(module.train_dataloader()))
    first_words = batch["labels"][:, 1]  # the first word's first sub-token, after [CLS]
    assert all(NAMES[int(t)] in {"B-PER", "B-LOC"} for t in first_words)
    assert (batch["labels"][:, 0] == IGNORE_INDEX).all()


def test_integer_tags_without_names_are_refused_when_the_model_is_built(tmp_path):
    rows = [{"tokens": r["tokens"], "tags": [NAMES.index(t) for t in r["tags"]]} for r in ROWS]
    path = write(tmp_path, rows)
    with pytest.raises(ValueError) as err:
        km.create_model("bert-tiny-token-cls", data=ner_data(path))
    message = str(err.value)
    assert "holds integer tags without names ([0, 1, 2, 3])" in message
    assert "Pass tag_names=[O, B-PER, I-PER, ...]" in message
    data = ner_data(path, tag_names=NAMES)
    module = km.create_model("bert-tiny-token-cls", data=data)
    assert module.model.config.id2label == dict(enumerate(NAMES))
    with pytest.raises(ValueError, match=r"has tag 3 but tag_names names 3 tags"):
        km.create_model("bert-tiny-token-cls", data=ner_data(path, tag_names=NAMES[:3]))


def _outputs(pred: list[str], gold: list[str]) -> dict[str, torch.Tensor]:
    labels = torch.tensor([[IGNORE_INDEX, *[NAMES.index(t) for t in gold]]])
    preds = torch.tensor([[0, *[NAMES.index(t) for t in pred]]])
    return {"preds": preds, "labels": labels, "nll_sum": torch.ones(1), "tokens": torch.ones(1)}


@pytest.mark.parametrize(("mode", "f1"), [("default", 1.0), ("strict", 0.0)])
def test_the_seqeval_mode_decides_whether_an_entity_may_start_with_i(tmp_path, mode, f1):
    data = ner_data(write(tmp_path, ROWS))
    module = km.create_model("bert-tiny-token-cls", data=data, seqeval_mode=mode)
    # predicted I-PER I-PER for gold B-PER I-PER: seqeval's default counts the entity,
    # seqeval's strict IOB2 finds no predicted entity (precision, recall, F1 all 0)
    scores = module.validation_metrics(_outputs(["I-PER", "I-PER", "O"], ["B-PER", "I-PER", "O"]))
    assert scores["f1"] == f1 and scores["accuracy"] == pytest.approx(2 / 3)


def test_strict_mode_matches_hand_counted_entities():
    seqeval = load_metric("seqeval")
    pred = [["B-PER", "I-PER", "O", "I-LOC", "B-ORG", "I-LOC"]]
    gold = [["B-PER", "I-PER", "O", "B-LOC", "B-ORG", "O"]]
    # strict: predicted PER(0,1), ORG(4,4) (I-LOC after ORG starts nothing); gold PER, LOC, ORG
    scores = seqeval.compute(predictions=pred, references=gold, mode="strict")
    assert (scores["precision"], scores["recall"]) == (1.0, pytest.approx(2 / 3))
    # default: I-LOC at 3 and at 5 start LOC(3,3) and LOC(5,5): 3 of 4 predicted are right
    lenient = seqeval.compute(predictions=pred, references=gold)
    assert (lenient["precision"], lenient["recall"]) == (0.75, 1.0)


def test_an_unknown_seqeval_mode_fails_naming_the_valid_ones():
    with pytest.raises(ValueError, match=r"seqeval_mode='iob1' is not valid; choose one of"):
        km.create_model("bert-tiny-token-cls", seqeval_mode="iob1")
