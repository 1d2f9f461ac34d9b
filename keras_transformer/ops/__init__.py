"""The model's math in `keras.ops` only, so it runs on every Keras backend.

- `attention`: scaled dot-product attention (paper section 3.2.1, equation (1));
- `layer_norm`: layer normalization and its closed-form gradient (section 3.1);
- `dropout`: dropout from 16 random bits per element (section 5.4);
- `label_smoothing`: the smoothed target and the per-token loss (section 5.4).
- `shapes`: axis sizes and reshape targets from the static shape where it is
  known, so that a traced graph reads no shape it already knows.

Layers (`keras_transformer/layers/`) build on these. Where TensorFlow has a
faster form, `keras_transformer/dispatch.py` chooses between these functions
and the TensorFlow-only kernels in `keras_transformer/kernels/`, which
compute the same values.
"""
