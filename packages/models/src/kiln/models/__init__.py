"""kiln.models: LightningModule wrappers for HuggingFace and TIMM models, with data and metrics.

``create_model(name, data=..., optimizer=..., scheduler=..., **kwargs)`` builds a
registered model; ``list_models()`` names them; ``@register_model`` adds one, and
``register_alias`` adds one that is another with some arguments set.
"""

from kiln.models import hf as _hf  # noqa: F401  (registers the HF models)
from kiln.models import vision as _vision  # noqa: F401  (registers the timm models)
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
