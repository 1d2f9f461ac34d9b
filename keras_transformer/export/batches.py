"""Running a translator's serving function over a list of sentences in
batches, and unpacking its outputs to Python per sentence. TensorFlow-only
module."""

import tensorflow as tf


def translate_in_batches(run, sentences, batch_size=32):
    """Calls `run(tf.constant(batch of strings)) -> {"translation", "score"}`
    on length-sorted batches and returns `(translations, scores)` in the
    input order, as `str` and `float`."""
    results = _in_batches(run, sentences, batch_size, lambda out: zip(
        (t.decode("utf-8") for t in out["translation"].numpy()),
        (float(s) for s in out["score"].numpy())))
    return [t for t, _ in results], [s for _, s in results]


def explain_in_batches(run, sentences, batch_size=32):
    """Calls `run(tf.constant(batch of strings))` -> the `translate_explain`
    signature's outputs on length-sorted batches and returns, in the input
    order, one dict per sentence, trimmed to its own lengths: `translation` (str),
    `score` (float), `source_pieces` (S str, eos last), `target_pieces` (T
    str), `token_log_probs` (T floats), `alignment` (T lists of S floats,
    row t the attention over the source while predicting target piece t)."""
    def unpack(out):
        out = {key: value.numpy() for key, value in out.items()}
        for b in range(len(out["translation"])):
            s, t = int(out["source_length"][b]), int(out["target_length"][b])
            yield {
                "translation": out["translation"][b].decode("utf-8"),
                "score": float(out["score"][b]),
                "source_pieces": [p.decode("utf-8") for p in out["source_pieces"][b, :s]],
                "target_pieces": [p.decode("utf-8") for p in out["target_pieces"][b, :t]],
                "token_log_probs": out["token_log_probs"][b, :t].tolist(),
                "alignment": out["alignment"][b, :t, :s].tolist(),
            }

    return _in_batches(run, sentences, batch_size, unpack)


def nbest_in_batches(run, sentences, batch_size=32):
    """Calls `run(tf.constant(batch of strings)) -> {"translations" [batch,
    n], "scores" [batch, n]}` on length-sorted batches and returns, in the
    input order, a list per sentence of `(str, float)` pairs."""
    return _in_batches(run, sentences, batch_size, lambda out: (
        [(t.decode("utf-8"), float(s)) for t, s in zip(texts, scores)]
        for texts, scores in zip(out["translations"].numpy(), out["scores"].numpy())))


def _in_batches(run, sentences, batch_size, unpack):
    """`unpack(run(batch))` (one item per sentence of the batch) over
    length-sorted batches, as a list in the input order."""
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be >= 1, received {batch_size}.")
    sentences = [s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in sentences]
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    results = [None] * len(sentences)
    for start in range(0, len(order), batch_size):
        indices = order[start:start + batch_size]
        out = run(tf.constant([sentences[i] for i in indices], tf.string))
        for i, item in zip(indices, unpack(out)):
            results[i] = item
    return results
