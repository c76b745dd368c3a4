"""A tiny ELECTRA tagger for your own NER files, exported in a format of its own."""

import json
from pathlib import Path
from typing import Any

from safetensors.torch import load_model, save_model

from kiln.models import HFTokenClassifier, register_model

ELECTRA_SMALL = {
    "hidden_size": 32, "embedding_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
    "intermediate_size": 64, "max_position_embeddings": 128,
}  # fmt: skip


class ElectraTagger(HFTokenClassifier):
    """Exports one safetensors file of the weights and the tag names beside it."""

    def export(self, out_dir: str | Path) -> Path:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        save_model(self.model, str(out / "tagger.safetensors"))
        (out / "tags.json").write_text(json.dumps(self.model.config.id2label))
        return out

    def load_export(self, out_dir: str | Path) -> None:
        load_model(self.model, str(Path(out_dir) / "tagger.safetensors"))


@register_model("electra-ner", task="token-classification", tiny={}, contract=2)
def electra_ner(**kwargs: Any) -> ElectraTagger:
    """A 2-layer, 32-wide ELECTRA tagger built from its config (random init)."""
    defaults = {"arch": "electra", "pretrained": None, "config_overrides": ELECTRA_SMALL}
    return ElectraTagger(**{**defaults, **kwargs})
