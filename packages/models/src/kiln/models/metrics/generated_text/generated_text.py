"""Scores of generated text against one reference each, as a local ``evaluate`` metric
module (loads offline): exact match, and sacrebleu's corpus BLEU and chrF.

``exact_match`` compares the strings with surrounding whitespace removed, as a fraction in
[0, 1]; ``bleu`` and ``chrf`` are sacrebleu's own (``sacrebleu.BLEU``, ``sacrebleu.CHRF``
with their default settings: 13a tokenization, 0-100 as sacrebleu reports them).
"""

import evaluate
import sacrebleu

from kiln.models.metrics import metric_info

_DESCRIPTION = "Exact match, sacreBLEU and chrF of generated strings against their references."
_KWARGS = """
Args:
    predictions (list of str): generated texts.
    references (list of str): one reference text per prediction.
Returns:
    exact_match (float): in [0, 1]; bleu, chrf (float): sacrebleu's corpus scores, 0-100.
"""


class GeneratedText(evaluate.Metric):
    def _info(self):
        return metric_info(_DESCRIPTION, _KWARGS, predictions="string", references="string")

    def _compute(self, *, predictions=None, references=None, **kwargs):
        if not predictions or references is None:
            raise ValueError("scores of an empty set of generated texts are undefined")
        exact = sum(p.strip() == r.strip() for p, r in zip(predictions, references, strict=True))
        return {
            "exact_match": exact / len(predictions),
            "bleu": sacrebleu.BLEU().corpus_score(predictions, [references]).score,
            "chrf": sacrebleu.CHRF().corpus_score(predictions, [references]).score,
        }
