"""Paper section 3 as Keras layers: one module per concept."""

from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.decoder import Decoder, DecoderLayer
from keras_transformer.layers.embedding import PositionalEmbedding, TokenEmbedding
from keras_transformer.layers.encoder import Encoder, EncoderLayer
from keras_transformer.layers.feed_forward import PositionwiseFeedForward
from keras_transformer.layers.masks import cache_mask, causal_mask, padding_mask
from keras_transformer.layers.position_encoding import (
    LearnedPositionEmbedding,
    SinusoidalPositionEncoding,
    sinusoidal_position_encoding,
)
from keras_transformer.layers.residual import ResidualNorm
from keras_transformer.ops.attention import scaled_dot_product_attention
