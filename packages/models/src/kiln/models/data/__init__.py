"""kiln's data modules (HF ``datasets`` under the hood) and the offline defaults."""

from kiln.models.data.base import IGNORE_INDEX, DataModule, PaddedValidationSet
from kiln.models.data.images import DIGITS, ImageClassificationData, load_digits
from kiln.models.data.sentiment import generate_sentiment
from kiln.models.data.sources import GENERATED_SENTIMENT, load_raw
from kiln.models.data.text import CausalLMData, TextClassificationData

__all__ = [
    "DIGITS",
    "GENERATED_SENTIMENT",
    "IGNORE_INDEX",
    "CausalLMData",
    "DataModule",
    "ImageClassificationData",
    "PaddedValidationSet",
    "TextClassificationData",
    "generate_sentiment",
    "load_digits",
    "load_raw",
]
