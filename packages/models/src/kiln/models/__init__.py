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
    "HFMaskedLM": "kiln.models.hf_masked_lm",
    "HFModule": "kiln.models.hf",
    "HFQuestionAnswering": "kiln.models.hf_question_answering",
    "HFSeq2SeqLM": "kiln.models.hf_seq2seq",
    "HFSequenceClassifier": "kiln.models.hf",
    "HFTokenClassifier": "kiln.models.hf_token_classification",
    "ImageClassifier": "kiln.models.image",
    "ImageModel": "kiln.models.contract",
    "KilnModel": "kiln.models.contract",
    "KilnModule": "kiln.models.module",
    "TextModel": "kiln.models.contract",
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
    "HFMaskedLM",
    "HFModule",
    "HFQuestionAnswering",
    "HFSeq2SeqLM",
    "HFSequenceClassifier",
    "HFTokenClassifier",
    "ImageClassifier",
    "ImageModel",
    "KilnModel",
    "KilnModule",
    "ModelEntry",
    "OptimizerConfig",
    "SchedulerConfig",
    "TextModel",
    "TimmClassifier",
    "create_model",
    "get_model_entry",
    "list_models",
    "register_alias",
    "register_model",
]
lazy_package(__name__, _EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see
    from kiln.models.contract import ImageModel, KilnModel, TextModel
    from kiln.models.hf import HFCausalLM, HFModule, HFSequenceClassifier
    from kiln.models.hf_masked_lm import HFMaskedLM
    from kiln.models.hf_question_answering import HFQuestionAnswering
    from kiln.models.hf_seq2seq import HFSeq2SeqLM
    from kiln.models.hf_token_classification import HFTokenClassifier
    from kiln.models.image import ImageClassifier
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
