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
    with pytest.raises(ValueError, match="accuracy, f1, perplexity"):
        load_metric("bleu")
