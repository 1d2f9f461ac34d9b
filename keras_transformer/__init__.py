"""keras_transformer: the Transformer of "Attention Is All You Need" in Keras 3.

The public names, one line each in docs/api.md:

- the model and its parts (portable Keras 3: TensorFlow and JAX backends):
  `get_config`, `TransformerConfig`, `PRESETS`, `Transformer`, `Encoder`,
  `Decoder`, `EncoderLayer`, `DecoderLayer`, `MultiHeadAttention`,
  `PositionwiseFeedForward`, `scaled_dot_product_attention`;
- decoding several of them as one: `TransformerEnsemble`;
- training it: `LabelSmoothedCrossEntropy`, `MaskedAccuracy`,
  `TransformerSchedule`, `transformer_adam`;
- the road from text to a served model (TensorFlow, loaded on first use):
  `SubwordTokenizer`, `data` (`translation_dataset`, `pairs_dataset`,
  `read_pairs`), `TrainingRun`, `ValidateMovingAverage`, `weights_digest`,
  `TrainingConfig`, `train`, `Translator`, `export_saved_model`, `load_saved_model`.
"""

from keras_transformer import startup

# A kt-* command (and only one) quiets TensorFlow's start-up and tunes
# malloc before the imports below load TensorFlow.
startup.start_if_command()

from keras_transformer.config import PRESETS, TransformerConfig, get_config  # noqa: E402
from keras_transformer.layers import (  # noqa: E402
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    MultiHeadAttention,
    PositionwiseFeedForward,
)
from keras_transformer.losses import LabelSmoothedCrossEntropy  # noqa: E402
from keras_transformer.metrics import MaskedAccuracy  # noqa: E402
from keras_transformer.ops.attention import scaled_dot_product_attention  # noqa: E402
from keras_transformer.schedules import TransformerSchedule, transformer_adam  # noqa: E402
from keras_transformer.transformer import Transformer  # noqa: E402

__version__ = "0.1.0"

# TensorFlow-only names, imported on first use so that the model and its
# layers import without TensorFlow (the JAX backend).
_TENSORFLOW_NAMES = {
    "SubwordTokenizer": "keras_transformer.tokenizer",
    "data": None,
    "TrainingRun": "keras_transformer.training.run",
    "ValidateMovingAverage": "keras_transformer.training.moving_average",
    "weights_digest": "keras_transformer.training.run",
    "TrainingConfig": "keras_transformer.pipeline.settings",
    "train": "keras_transformer.pipeline.trainer",
    "Translator": "keras_transformer.export.translator",
    "export_saved_model": "keras_transformer.export.saved_model",
    "load_saved_model": "keras_transformer.export.saved_model",
}

# Names of the layers above the model (decoding), also imported on first
# use: the facade sits below them (tests/test_imports.py).
_LATER_NAMES = {"TransformerEnsemble": "keras_transformer.decoding.ensemble"}

__all__ = [
    "PRESETS", "TransformerConfig", "get_config", "Transformer", "Encoder", "Decoder",
    "EncoderLayer", "DecoderLayer", "MultiHeadAttention", "PositionwiseFeedForward",
    "scaled_dot_product_attention", "LabelSmoothedCrossEntropy", "MaskedAccuracy",
    "TransformerSchedule", "transformer_adam", *_LATER_NAMES, *_TENSORFLOW_NAMES,
]


def __getattr__(name):
    if name not in _TENSORFLOW_NAMES and name not in _LATER_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module = {**_LATER_NAMES, **_TENSORFLOW_NAMES}[name]
    if module is None:
        return importlib.import_module(f"{__name__}.{name}")
    return getattr(importlib.import_module(module), name)


def __dir__():
    return sorted(set(globals()) | set(__all__))
