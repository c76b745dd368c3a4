"""Accuracy, as a local ``evaluate`` metric module (loads offline, no hub fetch)."""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = "Accuracy: the fraction of predictions that equal their reference label."
_KWARGS = """
Args:
    predictions (list of int): predicted labels.
    references (list of int): true labels.
Returns:
    accuracy (float): correct / total, in [0, 1].
"""


class Accuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS,
            features=datasets.Features(
                {"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}
            ),
        )

    def _compute(self, predictions, references):
        predictions = np.asarray(predictions)
        references = np.asarray(references)
        if predictions.size == 0:
            raise ValueError("accuracy of an empty set is undefined")
        return {"accuracy": float((predictions == references).mean())}
