"""Scripted language models for decoding tests: next-token probabilities
from a table indexed by (sentence, previous token), so expected outputs can
be worked out by hand."""

import numpy as np
from keras import ops

PAD, UNK, BOS, EOS, A, B = 0, 1, 2, 3, 4, 5
VOCAB = 6
FLOOR = 1e-9  # probability of tokens a row does not mention


def table(rows, vocab=VOCAB):
    """`rows`: {previous token: {next token: probability}} -> `(vocab,
    vocab)` log-probabilities (unmentioned tokens get FLOOR)."""
    probs = np.full((vocab, vocab), FLOOR, "float64")
    for prev, nexts in rows.items():
        for token, p in nexts.items():
            probs[prev, token] = p
    probs /= probs.sum(axis=1, keepdims=True)
    return np.log(probs).astype("float32")


class MarkovScript:
    """`symbols_to_logits_fn` for tables `(num_sentences, vocab, vocab)`.

    The sentence index and the previous token travel in the cache (so the
    search must tile and reorder it correctly for the output to be right);
    `calls` counts the steps run (eager mode only).
    """

    def __init__(self, tables):
        self.tables = np.asarray(tables, "float32")
        self.calls = 0

    def initial_cache(self, sentence_ids):
        return {"sentence": np.asarray(sentence_ids, "int32")}

    def __call__(self, ids, step, cache):
        self.calls += 1
        index = ops.stack([cache["sentence"], ops.cast(ids, "int32")], axis=1)
        flat = ops.reshape(self.tables, (-1, self.tables.shape[-1]))
        rows = index[:, 0] * self.tables.shape[1] + index[:, 1]
        return ops.take(flat, rows, axis=0), cache


def random_tables(num_sentences, vocab, seed, eos_bias=1.0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(num_sentences, vocab, vocab)) * 2.0
    logits[..., EOS] += eos_bias
    logits[..., PAD] = logits[..., UNK] = logits[..., BOS] = -30.0
    return logits.astype("float32")


class PrefixScript:
    """`symbols_to_logits_fn` whose next-token distribution depends on the
    whole prefix, through a hash kept in the cache: `state = (state * 31 +
    token + 1) % rows`, logits `tables[sentence, state]`. A search that
    reorders the cache wrongly gives wrong hypotheses or wrong scores.

    `tables`: `(num_sentences, rows, vocab)` logits.
    """

    def __init__(self, tables):
        self.tables = np.asarray(tables, "float32")
        self.rows = self.tables.shape[1]

    def initial_cache(self, sentence_ids):
        sentence_ids = np.asarray(sentence_ids, "int32")
        return {"sentence": sentence_ids, "state": np.zeros_like(sentence_ids)}

    def __call__(self, ids, step, cache):
        state = (cache["state"] * 31 + ops.cast(ids, "int32") + 1) % self.rows
        flat = ops.reshape(self.tables, (-1, self.tables.shape[-1]))
        logits = ops.take(flat, cache["sentence"] * self.rows + state, axis=0)
        return logits, {"sentence": cache["sentence"], "state": state}

    def log_prob(self, sentence, tokens):
        """Reference log P of `tokens` (after BOS), in numpy."""
        state, total = 0, 0.0
        for prev, token in zip([BOS] + list(tokens), tokens):
            state = (state * 31 + prev + 1) % self.rows
            row = self.tables[sentence, state].astype("float64")
            total += row[token] - np.log(np.exp(row).sum())
        return total


def random_prefix_tables(num_sentences, vocab, seed, rows=97, eos_bias=1.0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(num_sentences, rows, vocab)) * 2.0
    logits[..., EOS] += eos_bias
    logits[..., PAD] = logits[..., UNK] = logits[..., BOS] = -30.0
    return logits.astype("float32")
