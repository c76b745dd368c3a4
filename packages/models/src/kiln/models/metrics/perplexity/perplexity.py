"""Perplexity of a language model from per-sample NLL sums and token counts.

A local ``evaluate`` metric module (loads offline). Unlike the hub's ``perplexity``, it
does not run a model: the training loop already has the per-sample summed negative
log-likelihoods, and token-weighting them is what makes the figure exact.
"""

import evaluate
import numpy as np

from kiln.models.metrics import metric_info

_DESCRIPTION = "Perplexity: exp(total NLL / total tokens) over the whole set."
_KWARGS = """
Args:
    nll_sums (list of float): per-sample sums of token negative log-likelihoods (nats).
    token_counts (list of int): per-sample counts of the tokens those sums cover.
Returns:
    perplexity (float), loss (float): exp(mean token NLL) and the mean token NLL.
"""


class Perplexity(evaluate.Metric):
    def _info(self):
        return metric_info(_DESCRIPTION, _KWARGS, nll_sums="float64", token_counts="int64")

    def _compute(self, nll_sums, token_counts):
        total = float(np.sum(token_counts))
        if total <= 0:
            raise ValueError("perplexity needs at least one token; token_counts sum to 0")
        loss = float(np.sum(nll_sums)) / total
        return {"perplexity": float(np.exp(loss)), "loss": loss}
