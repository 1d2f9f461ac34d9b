"""The shared bench configuration and shapes (issue "Performance"), and the
helpers both throughput benchmarks use: `speed.py` (TensorFlow, beside
Model Garden) and `jax_benchmark.py` (JAX, no TensorFlow). No TensorFlow
here.

Model FLOP counts turn tokens/s into a fraction of the machine's matmul
peak. They count multiply-adds as 2 FLOPs and only the matrix products
(what dominates; softmax, norms and elementwise ops are left out), as
model-FLOP-utilisation figures usually do."""

import json

import numpy as np

# vocab 8,192 shared and tied, d_model 256, 3 + 3 layers, 4 heads, d_ff 1,024,
# dropout 0.1, post-LN.
BENCH = dict(vocab_size=8192, d_model=256, num_layers=3, num_heads=4, d_ff=1024,
             dropout=0.1, norm_first=False)
TRAIN_SHAPE = dict(batch=64, source_length=32, target_length=32)
TRANSLATE_SHAPE = dict(batch=32, source_length=20, beam_size=4, alpha=0.6, extra_length=10)


def make_config(name, overrides=()):
    """'bench' or a preset name (with the bench vocabulary); `overrides`:
    `key=value` strings (values parsed as JSON, else kept as strings)."""
    import keras_transformer as kt

    values = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected key=value")
        try:
            values[key] = json.loads(value)
        except json.JSONDecodeError:
            values[key] = value
    if name == "bench":
        return kt.TransformerConfig(**{**BENCH, **values})
    return kt.get_config(name, **{"vocab_size": BENCH["vocab_size"], **values})


def compiled_model(config, precision="float32", kt=None, jit_compile="auto", build=False):
    """`kt.Transformer(config)` (`kt`: the package, default this checkout's)
    compiled as kt-train compiles it: Adam on the paper's schedule,
    label-smoothed cross-entropy. Made, and with `build` built by one call,
    under the `precision` policy, which is float32 again after."""
    import keras

    if kt is None:
        import keras_transformer as kt
    keras.config.set_dtype_policy(precision)
    try:
        model = kt.Transformer(config)
        if build:
            ids = np.full((1, 2), 4, "int32")
            model((ids, ids), training=False)
        model.compile(optimizer=kt.transformer_adam(config.d_model),
                      loss=kt.LabelSmoothedCrossEntropy(config.label_smoothing,
                                                        pad_id=config.pad_id),
                      jit_compile=jit_compile)
    finally:
        keras.config.set_dtype_policy("float32")
    return model


def random_ids(config, batch, length, seed):
    """`(batch, length)` int32 ids above the special ones, so there is no
    padding and no early eos."""
    rng = np.random.default_rng(seed)
    return rng.integers(4, config.vocab_size, (batch, length)).astype("int32")


def peak_dtype(precision):
    """The dtype a precision policy multiplies in."""
    return {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}.get(precision, "float32")


def forward_flops(config, batch, source_length, target_length):
    """FLOPs of one forward pass over `batch` pairs of the given lengths."""
    d, f, s, t = config.d_model, config.d_ff, source_length, target_length
    encoder_layer = 8 * s * d * d + 4 * s * s * d + 4 * s * d * f
    decoder_layer = (
        8 * t * d * d + 4 * t * t * d  # masked self-attention
        + 4 * t * d * d + 4 * s * d * d + 4 * t * s * d  # encoder-decoder attention
        + 4 * t * d * f  # feed-forward
    )
    projection = 2 * t * d * config.output_vocab_size
    per_pair = (config.num_layers * encoder_layer
                + config.decoder_layers * decoder_layer + projection)
    return batch * per_pair


def training_flops(config, batch, source_length, target_length):
    """Forward + backward (the backward pass costs about twice the forward)."""
    return 3 * forward_flops(config, batch, source_length, target_length)
