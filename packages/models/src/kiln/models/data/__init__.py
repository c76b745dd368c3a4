"""kiln's data modules (HF ``datasets`` under the hood) and the offline defaults."""

from kiln.models.data.base import IGNORE_INDEX, DataModule, PaddedValidationSet
from kiln.models.data.images import DIGITS, ImageClassificationData, load_digits
from kiln.models.data.masked_lm import MaskedLMData
from kiln.models.data.question_answering import QuestionAnsweringData
from kiln.models.data.sentiment import generate_sentiment
from kiln.models.data.seq2seq import Seq2SeqData
from kiln.models.data.sources import GENERATED_SENTIMENT, GENERATORS, load_raw
from kiln.models.data.text import CausalLMData, TextClassificationData, TextData
from kiln.models.data.token_classification import TokenClassificationData

__all__ = [
    "DIGITS",
    "GENERATED_SENTIMENT",
    "GENERATORS",
    "IGNORE_INDEX",
    "CausalLMData",
    "DataModule",
    "ImageClassificationData",
    "MaskedLMData",
    "PaddedValidationSet",
    "QuestionAnsweringData",
    "Seq2SeqData",
    "TextClassificationData",
    "TextData",
    "TokenClassificationData",
    "generate_sentiment",
    "load_digits",
    "load_raw",
]
