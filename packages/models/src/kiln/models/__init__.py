"""kiln.models: LightningModule wrappers for HuggingFace and TIMM models, with data and metrics.

``create_model(name, data=..., optimizer=..., scheduler=..., **kwargs)`` builds a
registered model; ``list_models()`` names them; ``@register_model`` adds one, and
``register_alias`` adds one that is another with some arguments set.

Names are imported on first use: ``OptimizerConfig`` does not import transformers or timm;
the registry imports kiln's own HF and timm models when it is first asked for a model.
"""

from typing import TYPE_CHECKING

from kiln.core.lazy import lazy_package

_EXPORTS = {
    "HFCausalLM": "kiln.models.hf",
    "HFModule": "kiln.models.hf",
    "HFSequenceClassifier": "kiln.models.hf",
    "KilnModule": "kiln.models.module",
    "OptimizerConfig": "kiln.models.optim",
    "SchedulerConfig": "kiln.models.optim",
    "ModelEntry": "kiln.models.registry",
    "create_model": "kiln.models.registry",
    "get_model_entry": "kiln.models.registry",
    "list_models": "kiln.models.registry",
    "register_alias": "kiln.models.registry",
    "register_model": "kiln.models.registry",
    "TimmClassifier": "kiln.models.vision",
}
__all__ = [
    "HFCausalLM",
    "HFModule",
    "HFSequenceClassifier",
    "KilnModule",
    "ModelEntry",
    "OptimizerConfig",
    "SchedulerConfig",
    "TimmClassifier",
    "create_model",
    "get_model_entry",
    "list_models",
    "register_alias",
    "register_model",
]
lazy_package(__name__, _EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see
    from kiln.models.hf import HFCausalLM, HFModule, HFSequenceClassifier
    from kiln.models.module import KilnModule
    from kiln.models.optim import OptimizerConfig, SchedulerConfig
    from kiln.models.registry import (
        ModelEntry,
        create_model,
        get_model_entry,
        list_models,
        register_alias,
        register_model,
    )
    from kiln.models.vision import TimmClassifier
