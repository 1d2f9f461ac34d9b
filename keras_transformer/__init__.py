"""keras_transformer: the Transformer of "Attention Is All You Need" in Keras 3."""

from keras_transformer import startup

# A kt-* command (and only one) quiets TensorFlow's start-up and tunes
# malloc before the imports below load TensorFlow.
startup.start_if_command()

from keras_transformer.config import PRESETS, TransformerConfig, get_config
from keras_transformer.layers import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    MultiHeadAttention,
    PositionwiseFeedForward,
)
from keras_transformer.losses import LabelSmoothedCrossEntropy
from keras_transformer.metrics import MaskedAccuracy
from keras_transformer.ops.attention import scaled_dot_product_attention
from keras_transformer.schedules import TransformerSchedule, transformer_adam
from keras_transformer.transformer import Transformer

__version__ = "0.1.0"
