"""What the token-weighted HF task wrappers share: logits of the model's inputs, loss and
count over the labels' counted tokens, per-token validation outputs."""

from __future__ import annotations

import torch

from kiln.models.hf import HFModule
from kiln.models.tokens import count_tokens, mean_token_loss, token_nll, token_outputs


class HFTokenModule(HFModule):
    """An HF model whose loss is a mean over the label tokens that count (not -100): masked
    LM, seq2seq, token classification. Subclasses add ``validation_metrics``."""

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model(**self.model_inputs(batch)).logits

    def loss_and_count(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return mean_token_loss(*token_nll(self.logits(batch), batch["labels"]))

    def count_items(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return count_tokens(batch["labels"])

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict:
        return token_outputs(self.logits(batch), batch["labels"])
