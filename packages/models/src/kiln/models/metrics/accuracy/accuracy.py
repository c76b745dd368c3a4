"""Accuracy, as a local ``evaluate`` metric module (loads offline, no hub fetch)."""

import evaluate
import numpy as np

from kiln.models.metrics import metric_info

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
        return metric_info(_DESCRIPTION, _KWARGS, predictions="int64", references="int64")

    def _compute(self, predictions, references):
        predictions = np.asarray(predictions)
        references = np.asarray(references)
        if predictions.size == 0:
            raise ValueError("accuracy of an empty set is undefined")
        return {"accuracy": float((predictions == references).mean())}
