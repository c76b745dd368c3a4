"""SQuAD's exact match and F1, as a local ``evaluate`` metric module (loads offline).

The answer normalization is SQuAD v1.1's: lower case, no punctuation, no articles
(a, an, the), whitespace collapsed; F1 is over the normalized answers' words.
"""

import collections
import re
import string

import evaluate

from kiln.models.metrics import metric_info

_DESCRIPTION = "Exact match and word F1 of predicted answer strings against the references."
_KWARGS = """
Args:
    predictions (list of str): predicted answers.
    references (list of str): true answers.
Returns:
    exact_match (float), f1 (float): means over the answers, in [0, 1].
"""


def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _f1(prediction: str, reference: str) -> float:
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((collections.Counter(pred) & collections.Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


class Squad(evaluate.Metric):
    def _info(self):
        return metric_info(_DESCRIPTION, _KWARGS, predictions="string", references="string")

    def _compute(self, predictions, references):
        if not predictions:
            raise ValueError("exact match of an empty set is undefined")
        pairs = list(zip(predictions, references, strict=True))
        exact = [normalize_answer(p) == normalize_answer(r) for p, r in pairs]
        return {
            "exact_match": sum(exact) / len(pairs),
            "f1": sum(_f1(p, r) for p, r in pairs) / len(pairs),
        }
