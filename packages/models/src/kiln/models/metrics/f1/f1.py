"""F1 score, as a local ``evaluate`` metric module (loads offline, no hub fetch)."""

import evaluate
import numpy as np

from kiln.models.metrics import metric_info

_DESCRIPTION = "F1: the harmonic mean of precision and recall, per class or averaged."
_KWARGS = """
Args:
    predictions (list of int): predicted labels.
    references (list of int): true labels.
    average (str): "binary" (F1 of pos_label), "macro" (unweighted mean over classes),
        "micro" (from the pooled counts; equals accuracy for single-label data).
    pos_label (int): the positive class for "binary".
Returns:
    f1 (float): in [0, 1].
"""

_AVERAGES = ("binary", "macro", "micro")


def _f1(tp: float, fp: float, fn: float) -> float:
    denom = 2 * tp + fp + fn
    return 0.0 if denom == 0 else 2 * tp / denom


class F1(evaluate.Metric):
    def _info(self):
        return metric_info(_DESCRIPTION, _KWARGS, predictions="int64", references="int64")

    def _compute(self, predictions, references, average="binary", pos_label=1):
        if average not in _AVERAGES:
            raise ValueError(f"average={average!r} is not valid; choose one of: {_AVERAGES}")
        predictions = np.asarray(predictions)
        references = np.asarray(references)

        def counts(label):
            tp = float(((predictions == label) & (references == label)).sum())
            fp = float(((predictions == label) & (references != label)).sum())
            fn = float(((predictions != label) & (references == label)).sum())
            return tp, fp, fn

        if average == "binary":
            return {"f1": _f1(*counts(pos_label))}
        labels = np.union1d(predictions, references)
        per_class = [counts(label) for label in labels]
        if average == "macro":
            return {"f1": float(np.mean([_f1(*c) for c in per_class]))}
        return {"f1": _f1(*np.sum(per_class, axis=0))}
