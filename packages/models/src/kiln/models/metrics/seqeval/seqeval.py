"""Entity-level precision, recall and F1 of IOB2 tag sequences, and token accuracy, as a
local ``evaluate`` metric module (loads offline).

``mode="default"`` is seqeval's default (lenient) mode: an entity is a maximal run
``B-X I-X ...``, and an ``I-X`` after something other than ``X`` starts an entity too, so
``I-PER I-PER`` matches a reference ``B-PER I-PER``. ``mode="strict"`` is seqeval's
``mode="strict", scheme=IOB2``: an entity starts only at ``B-X`` and an ``I-X`` that
continues no ``X`` belongs to no entity. A predicted entity counts when its type and both
ends equal a reference entity's.
"""

import evaluate

from kiln.models.metrics import metric_info

_DESCRIPTION = "seqeval-style entity precision/recall/F1 and token accuracy of IOB2 tags."
_KWARGS = """
Args:
    predictions (list of list of str): predicted tags per sequence.
    references (list of list of str): true tags per sequence (same lengths).
    mode (str): "default" (seqeval's lenient IOB2) or "strict" (seqeval's strict IOB2).
Returns:
    precision, recall, f1 (float): over entities (micro); accuracy (float): over tags.
"""


MODES = ("default", "strict")


def entities(tags: list[str], strict: bool = False) -> set[tuple[str, int, int]]:
    """The (type, first, last) entities of one IOB2 sequence (``strict``: only from ``B-``)."""
    found, start, kind = set(), None, None
    starts = ("B",) if strict else ("B", "I")
    for i, tag in enumerate([*tags, "O"]):
        prefix, _, label = tag.partition("-")
        continues = prefix == "I" and label == kind
        if start is not None and not continues:
            found.add((kind, start, i - 1))
            start, kind = None, None
        if prefix in starts and not continues:
            start, kind = i, label
    return found


class Seqeval(evaluate.Metric):
    def _info(self):
        return metric_info(_DESCRIPTION, _KWARGS, predictions=["string"], references=["string"])

    def _compute(self, predictions, references, mode="default"):
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is not a seqeval mode; choose one of: {MODES}")
        tp = n_pred = n_ref = correct = total = 0
        for pred, ref in zip(predictions, references, strict=True):
            if len(pred) != len(ref):
                raise ValueError(f"a sequence has {len(pred)} predicted tags for {len(ref)}")
            p, r = entities(pred, mode == "strict"), entities(ref, mode == "strict")
            tp, n_pred, n_ref = tp + len(p & r), n_pred + len(p), n_ref + len(r)
            correct += sum(a == b for a, b in zip(pred, ref, strict=True))
            total += len(ref)
        if total == 0:
            raise ValueError("seqeval of an empty set is undefined")
        precision = tp / n_pred if n_pred else 0.0
        recall = tp / n_ref if n_ref else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return {"precision": precision, "recall": recall, "f1": f1, "accuracy": correct / total}
