import math

import numpy as np
import pytest

from keras_transformer.layers import LearnedPositionEmbedding, sinusoidal_position_encoding


def test_sinusoid_matches_the_formula():
    d = 16
    pe = np.asarray(sinusoidal_position_encoding(50, d))
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert pe[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-5)
            assert pe[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-5)


def test_sinusoid_any_length_and_offset():
    long = np.asarray(sinusoidal_position_encoding(5000, 8))
    assert long.shape == (5000, 8) and np.all(np.isfinite(long))
    np.testing.assert_allclose(sinusoidal_position_encoding(3, 8, start=4000), long[4000:4003],
                               atol=1e-4)


def test_learned_positions_reject_statically_longer_input():
    layer = LearnedPositionEmbedding(4, 8)
    assert tuple(layer(np.zeros((2, 3, 8), "float32")).shape) == (3, 8)
    with pytest.raises(ValueError, match="exceeds"):
        layer(np.zeros((2, 6, 8), "float32"))
