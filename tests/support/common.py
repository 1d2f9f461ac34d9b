"""Helpers shared by the test modules: random token ids, and a tiny model
trained on one batch or fitted as a script would."""

import keras
import numpy as np

import keras_transformer as kt


def random_ids(shape, low=4, high=40, seed=0):
    return np.random.default_rng(seed).integers(low, high, size=shape).astype("int32")


def train_on_one_batch(config, steps, jit_compile=False):
    """Trains `config`'s model from seed 0 on one random batch (4 sentences,
    source 7 and target 6 ids) for `steps` steps.

    Returns: `(losses, weights)`.
    """
    rng = np.random.default_rng(2)
    source = rng.integers(4, config.vocab_size, (4, 7)).astype("int32")
    target = rng.integers(4, config.vocab_size, (4, 6)).astype("int32")
    keras.utils.set_random_seed(0)
    model = kt.Transformer(config)
    model.compile(optimizer=kt.transformer_adam(config.d_model), jit_compile=jit_compile,
                  loss=kt.LabelSmoothedCrossEntropy(config.label_smoothing,
                                                    pad_id=config.pad_id))
    losses = [float(model.train_on_batch((source, target[:, :-1]), target[:, 1:]))
              for _ in range(steps)]
    return losses, [w.numpy() for w in model.weights]


def force_matmul_kernels(monkeypatch, kind):
    """Has `keras_transformer.dispatch` decide as if TensorFlow multiplied
    with `kind` ("onednn" or "eigen") kernels, until the test ends."""
    from keras_transformer import dispatch

    monkeypatch.setattr(dispatch, "_settings", dict(dispatch._settings))
    dispatch.configure(matmul_kernels=kind)


def train_with_and_without_eigen(monkeypatch, config, calls, steps=3):
    """`train_on_one_batch` twice: with dispatch deciding as under oneDNN,
    then as under Eigen (`force_matmul_kernels`), asserting that the first
    run added nothing to `calls` (a spy's list).

    Returns: `{eigen: (losses, weights)}` for `eigen` False and True.
    """
    runs = {}
    for eigen in (False, True):
        force_matmul_kernels(monkeypatch, "eigen" if eigen else "onednn")
        runs[eigen] = train_on_one_batch(config, steps)
        if not eigen:
            assert calls == []
    return runs


def record_token_batches(monkeypatch, stop=None):
    """Makes `batching.token_batches` record the keyword arguments of each
    call (kt-train's training and validation streams) in the returned list,
    and then do its work, or raise `stop` (an exception class) instead, for
    a test that needs only the first stream's settings."""
    from keras_transformer.data import batching

    calls = []
    token_batches = batching.token_batches

    def recording(*args, **kwargs):
        calls.append(kwargs)
        if stop is not None:
            raise stop
        return token_batches(*args, **kwargs)

    monkeypatch.setattr(batching, "token_batches", recording)
    return calls


def fit_copy_task(sentences, **config_fields):
    """`model.fit` for two updates of the `tiny` preset (with
    `config_fields`) on `sentences` translated to themselves, as a script
    would; returns the first epoch's loss."""
    tok = kt.SubwordTokenizer.train(sentences, vocab_size=400)
    config = kt.get_config("tiny", tokenizer=tok, **config_fields)
    model = kt.Transformer(config)
    model.compile(optimizer=kt.transformer_adam(config.d_model, warmup_steps=10),
                  loss=kt.LabelSmoothedCrossEntropy(pad_id=config.pad_id))
    data = kt.data.translation_dataset([(s, s) for s in sentences], tok, batch_tokens=256)
    return model.fit(data, epochs=1, steps_per_epoch=2, verbose=0).history["loss"][0]
