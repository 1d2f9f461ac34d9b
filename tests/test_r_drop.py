"""R-Drop (`keras_transformer/r_drop.py`, `TransformerConfig.r_drop`,
`kt-train --r-drop`): the loss is the mean of two passes' cross-entropies
plus alpha times their symmetric KL, from `model.fit` in a script and from
kt-train."""

import keras
import numpy as np
import pytest
from test_tokenizer import CORPUS

import keras_transformer as kt
from keras_transformer.cli.train import build_parser, training_config
from keras_transformer.pipeline.settings import model_config
from keras_transformer.r_drop import symmetric_kl
from support.common import fit_copy_task


def numpy_symmetric_kl(a, b):
    pa = np.exp(a - a.max(-1, keepdims=True))
    pa /= pa.sum(-1, keepdims=True)
    pb = np.exp(b - b.max(-1, keepdims=True))
    pb /= pb.sum(-1, keepdims=True)
    return 0.5 * ((pa * np.log(pa / pb)).sum(-1) + (pb * np.log(pb / pa)).sum(-1))


def test_symmetric_kl_is_the_mean_of_both_divergences():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, 3, 4, 11)).astype("float32") * 3
    np.testing.assert_allclose(np.asarray(symmetric_kl(a, b)), numpy_symmetric_kl(a, b),
                               rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(symmetric_kl(a, a)), 0.0, atol=1e-7)


def label_smoothed_ce(logits, labels, eps, pad):
    vocab = logits.shape[-1]
    log_p = logits - logits.max(-1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(-1, keepdims=True))
    target = np.full(logits.shape, eps / (vocab - 1))
    np.put_along_axis(target, labels[..., None], 1 - eps, axis=-1)
    kl = (target * (np.log(target) - log_p)).sum(-1)
    real = labels != pad
    return (kl * real).sum() / real.sum()


@pytest.mark.parametrize("alpha", [0.0, 2.5])
def test_the_loss_is_the_mean_cross_entropy_plus_alpha_times_the_kl(alpha):
    """Two forward passes whose logits are known: `compute_loss` in
    training gives R-Drop's loss, worked out in NumPy; alpha 0 one pass."""
    config = kt.get_config("tiny", vocab_size=13, r_drop=alpha, label_smoothing=0.1)
    model = kt.Transformer(config)
    model.compile(loss=kt.LabelSmoothedCrossEntropy(0.1, pad_id=config.pad_id))
    rng = np.random.default_rng(1)
    first, second = rng.normal(size=(2, 2, 5, 13)).astype("float32")
    labels = rng.integers(4, 13, size=(2, 5))
    labels[1, 3:] = config.pad_id
    passes = []

    def call(inputs, training=None):
        passes.append(training)
        return keras.ops.convert_to_tensor(second)

    model.call = call
    x = (np.ones((2, 4), "int32"), np.ones((2, 5), "int32"))
    loss = float(model.compute_loss(x, labels, keras.ops.convert_to_tensor(first),
                                    training=True))
    ce = [label_smoothed_ce(v, labels, 0.1, config.pad_id) for v in (first, second)]
    kl = numpy_symmetric_kl(first, second)
    real = labels != config.pad_id
    expected = (0.5 * (ce[0] + ce[1]) + alpha * (kl * real).sum() / real.sum()
                if alpha else ce[0])
    assert loss == pytest.approx(expected, rel=1e-5)
    assert passes == ([True] if alpha else [])
    # Not in evaluation: one pass, the plain cross-entropy.
    passes.clear()
    loss = float(model.compute_loss(x, labels, keras.ops.convert_to_tensor(first),
                                    training=False))
    assert loss == pytest.approx(ce[0], rel=1e-5) and passes == []


def test_a_script_trains_with_it_through_fit():
    assert np.isfinite(fit_copy_task(CORPUS, r_drop=1.0, dropout=0.3))
    with pytest.raises(ValueError, match="r_drop"):
        kt.get_config("tiny", vocab_size=40, r_drop=-1.0)


def test_kt_train_r_drop_sets_the_model_field():
    tok = kt.SubwordTokenizer.train(CORPUS, vocab_size=400)
    parser = build_parser()
    for argv, expected in ((["--run-dir", "r", "--config", "tiny"], 0.0),
                           (["--run-dir", "r", "--config", "tiny", "--r-drop", "5"], 5.0),
                           (["--run-dir", "r", "--config", "tiny", "--set", "r_drop=0.5"], 0.5)):
        settings = training_config(parser.parse_args(argv), argv)
        assert model_config(settings, tok, tok).r_drop == expected
