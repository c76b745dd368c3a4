import pytest

from kiln.models.metrics import load_metric


def test_metrics_load_offline_and_compute():
    acc = load_metric("accuracy").compute(predictions=[0, 1, 1, 1], references=[0, 1, 0, 1])
    assert acc == {"accuracy": 0.75}
    f1 = load_metric("f1")
    assert f1.compute(predictions=[0, 1, 1, 1], references=[0, 1, 0, 1])["f1"] == pytest.approx(0.8)
    macro = f1.compute(predictions=[0, 1, 2, 2], references=[0, 1, 1, 2], average="macro")
    assert macro["f1"] == pytest.approx((1 + 2 / 3 + 2 / 3) / 3)
    ppl = load_metric("perplexity").compute(nll_sums=[3.0, 1.0], token_counts=[3, 1])
    assert ppl["loss"] == pytest.approx(1.0) and ppl["perplexity"] == pytest.approx(2.718281828)


def test_unknown_metric_names_the_shipped_ones():
    with pytest.raises(ValueError, match="accuracy, f1, generated_text, perplexity"):
        load_metric("bleu")


def test_squad_exact_match_and_f1_normalize_answers():
    squad = load_metric("squad")
    scores = squad.compute(
        predictions=["The Paris.", "new york", "rome"],
        references=["paris", "new york city", "oslo"],
    )
    assert scores["exact_match"] == pytest.approx(1 / 3)
    assert scores["f1"] == pytest.approx((1 + 0.8 + 0) / 3)  # new york: P 1, R 2/3


def test_seqeval_scores_whole_entities_and_tokens():
    seqeval = load_metric("seqeval")
    reference = ["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "O"]
    predicted = ["B-PER", "I-PER", "O", "B-LOC", "O", "O"]  # the place cut short: wrong
    scores = seqeval.compute(predictions=[predicted], references=[reference])
    assert (scores["precision"], scores["recall"]) == (0.5, 0.5)
    assert scores["f1"] == 0.5 and scores["accuracy"] == pytest.approx(5 / 6)
    # an I- tag after O starts an entity (seqeval's lenient IOB2)
    lenient = seqeval.compute(
        predictions=[["O", "I-ORG", "I-ORG"]], references=[["O", "B-ORG", "I-ORG"]]
    )
    assert lenient["f1"] == 1.0


def test_metric_inputs_have_their_types():
    import datasets

    tags = datasets.Sequence(datasets.Value("string"))
    assert load_metric("seqeval").features == datasets.Features(predictions=tags, references=tags)
    text = datasets.Value("string")
    assert load_metric("squad").features == datasets.Features(predictions=text, references=text)
    label = datasets.Value("int64")
    assert load_metric("accuracy").features == datasets.Features(
        predictions=label, references=label
    )
