"""LayerDrop (`TransformerConfig.layer_drop`, the stacks' `layer_drop`):
in training each layer is skipped for the whole batch with probability
`layer_drop`, its input passed on; inference runs every layer."""

import numpy as np
import pytest
from test_tokenizer import CORPUS

import keras_transformer as kt
from keras_transformer.cli.train import build_parser, training_config
from keras_transformer.pipeline.settings import model_config
from support.common import fit_copy_task
from support.float32 import assert_close_in_ulps

SIZES = dict(d_model=8, num_heads=2, d_ff=12)
CALLS = 60


def stack_and_inputs(cls, **kwargs):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, 8)).astype("float32")
    memory = rng.normal(size=(2, 4, 8)).astype("float32")
    stack = cls(**SIZES, **kwargs)
    args = (x, memory) if cls is kt.Decoder else (x,)
    stack(*args)
    return stack, args


@pytest.mark.numerics
@pytest.mark.parametrize("cls", [kt.Encoder, kt.Decoder])
def test_training_skips_whole_layers_and_inference_runs_them_all(cls):
    """One layer and no dropout: a training call returns either the input
    exactly (skipped: no arithmetic) or what inference returns (run, within
    float32 summation order: the training graph may sum in another order),
    and each happens about half the time at rate 0.5."""
    stack, args = stack_and_inputs(cls, num_layers=1, layer_drop=0.5, seed=7)
    plain, _ = stack_and_inputs(cls, num_layers=1)
    plain.set_weights(stack.get_weights())
    full = np.asarray(stack(*args, training=False))
    assert_close_in_ulps(np.asarray(plain(*args, training=False)), full)
    assert not np.allclose(full, args[0], atol=1e-3)
    skipped = 0
    for _ in range(CALLS):
        y = np.asarray(stack(*args, training=True))
        if np.array_equal(y, args[0]):
            skipped += 1
        else:
            assert_close_in_ulps(y, full)
    # Binomial(60, 0.5): outside [15, 45] with probability below 1e-4.
    assert 15 <= skipped <= 45


def test_each_layer_is_chosen_on_its_own():
    """Two layers at rate 0.5: the skipped set varies between calls, so
    four different outputs appear (none, either, both layers skipped)."""
    stack, (x,) = stack_and_inputs(kt.Encoder, num_layers=2, layer_drop=0.5, seed=1)
    outputs = {np.asarray(stack(x, training=True)).round(5).tobytes() for _ in range(CALLS)}
    assert len(outputs) == 4


def test_a_skipped_layer_gets_no_gradient():
    import tensorflow as tf

    stack, (x,) = stack_and_inputs(kt.Encoder, num_layers=1, layer_drop=0.5, seed=3)
    norms = []
    for _ in range(20):
        with tf.GradientTape() as tape:
            y = stack(x, training=True)
            loss = tf.reduce_sum(y * y)
        grads = tape.gradient(loss, stack.trainable_weights)
        norms.append(sum(float(tf.reduce_sum(g * g)) for g in grads if g is not None))
    assert 0.0 in norms and max(norms) > 0.0


def test_off_adds_no_state_and_the_config_round_trips():
    stack, _ = stack_and_inputs(kt.Encoder, num_layers=2)
    assert not hasattr(stack, "seed_generator") and "layer_drop" not in stack.get_config()
    stack, _ = stack_and_inputs(kt.Decoder, num_layers=2, layer_drop=0.2, seed=5)
    clone = kt.Decoder.from_config(stack.get_config())
    assert (clone.layer_drop, clone.seed) == (0.2, 5)
    with pytest.raises(ValueError, match="layer_drop"):
        kt.Encoder(num_layers=2, **SIZES, layer_drop=1.0)
    with pytest.raises(ValueError, match="layer_drop"):
        kt.get_config("tiny", vocab_size=40, layer_drop=-0.1)
    config = kt.get_config("tiny", vocab_size=40, layer_drop=0.2)
    model = kt.Transformer(config)
    assert model.encoder.layer_drop == model.decoder.layer_drop == 0.2
    # Exact resume checkpoints the model's variables that are not weights
    # (`TrainingRun`): the layer choices' random stream is among them.
    model.build()
    weights = {id(v) for v in model.weights}
    states = {id(v) for v in model.variables if id(v) not in weights}
    assert {id(model.encoder.seed_generator.state),
            id(model.decoder.seed_generator.state)} <= states
    assert kt.Transformer(kt.get_config("tiny", vocab_size=40)).encoder.layer_drop == 0.0


def test_a_script_trains_with_it_through_fit():
    assert np.isfinite(fit_copy_task(CORPUS, layer_drop=0.3, r_drop=1.0))


def test_kt_train_sets_it_with_set():
    tok = kt.SubwordTokenizer.train(CORPUS, vocab_size=400)
    parser = build_parser()
    for argv, expected in ((["--run-dir", "r", "--config", "tiny"], 0.0),
                           (["--run-dir", "r", "--config", "tiny", "--set",
                             "layer_drop=0.1"], 0.1)):
        settings = training_config(parser.parse_args(argv), argv)
        assert model_config(settings, tok, tok).layer_drop == expected
    argv = ["--run-dir", "r", "--config", "tiny", "--set", "layer_drop=1.5"]
    with pytest.raises(ValueError, match=r"`layer_drop` must be in \[0, 1\), received 1\.5"):
        model_config(training_config(parser.parse_args(argv), argv), tok, tok)


def test_translation_runs_every_layer():
    """Beam search over a LayerDrop model translates as the same weights
    without it: decoding never skips a layer."""
    tok = kt.SubwordTokenizer.train(CORPUS, vocab_size=400)
    dropped = kt.Transformer(kt.get_config("tiny", tokenizer=tok, layer_drop=0.5))
    plain = kt.Transformer(kt.get_config("tiny", tokenizer=tok))
    dropped.build()
    plain.build()
    plain.set_weights(dropped.get_weights())
    sentences = CORPUS[:4]
    expected = kt.Translator(plain, tok, extra_length=8).translate(sentences)
    assert kt.Translator(dropped, tok, extra_length=8).translate(sentences) == expected
