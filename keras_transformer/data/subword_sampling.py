"""Subword regularization: a different segmentation of each training pair
every time it is seen.

Kudo (2018), "Subword Regularization: Improving Neural Network Translation
Models with Multiple Subword Candidates", section 3.3: with a unigram
vocabulary, draw the segmentation `x` of a sentence from its `l` most
likely ones with probability proportional to `P(x) ** alpha`. Small
`alpha` spreads the draws over many segmentations, large `alpha` keeps to
the most likely one (the tokenizer's). It regularises a model trained on
a small corpus; evaluation and translation keep the single best
segmentation.

The `l` best segmentations of every training sentence are computed once,
with the `sentencepiece` package, and kept in memory; each epoch draws from
them with a stateless generator keyed by the run's seed and the pair's
position in the stream, so the stream of batches is the same on every run
with the same seed, and a resumed run (`token_batches(skip_batches=)`)
continues it exactly.
"""

import array
import dataclasses
import math

import numpy as np
import sentencepiece
import tensorflow as tf

_CHUNK = 1024


@dataclasses.dataclass(frozen=True)
class SubwordSampling:
    """How the training segmentations are drawn.

    Attributes:
        alpha: the smoothing exponent (> 0): a segmentation `x` of a
            sentence is drawn with probability `P(x) ** alpha` over the sum
            of those of the `nbest` candidates. Kudo's translation
            experiments use 0.1 to 0.5.
        nbest: how many of a sentence's most likely segmentations are
            candidates (>= 2); memory grows with it (about `nbest` times the
            token ids of the training split).
    """

    alpha: float
    nbest: int

    def __post_init__(self):
        if not (isinstance(self.alpha, (int, float)) and math.isfinite(self.alpha)
                and self.alpha > 0):
            raise ValueError(f"The subword sampling `alpha` must be a positive number, "
                             f"received {self.alpha!r}.")
        if isinstance(self.nbest, bool) or not isinstance(self.nbest, int) or self.nbest < 2:
            raise ValueError(f"The subword sampling `nbest` must be an int >= 2, received "
                             f"{self.nbest!r}.")


def check_unigram(model_proto):
    """Raises ValueError unless the SentencePiece model can list a
    sentence's n best segmentations (unigram models can, BPE ones cannot)."""
    _unigram_processor(model_proto)


def _unigram_processor(model_proto):
    """The model's `SentencePieceProcessor`; ValueError as `check_unigram`."""
    processor = sentencepiece.SentencePieceProcessor(model_proto=model_proto)
    try:
        processor.nbest_encode("a", nbest_size=2, out_type=int)
    except RuntimeError:
        raise ValueError(
            "Subword sampling needs a unigram SentencePiece vocabulary (its n best "
            "segmentations are the candidates); this one is not unigram (BPE?). Train one "
            "with `--vocab-model-type unigram`, the default.") from None
    return processor


def nbest_segmentations(model_proto, texts, nbest):
    """The `nbest` most likely segmentations of each text, and their log-probabilities.

    Args:
        model_proto: a unigram SentencePiece model (bytes).
        texts: a sequence of `str`.
        nbest: candidates per text (fewer where a text has fewer distinct
            segmentations; an empty text has one, the empty one).

    Returns: `(ids, log_probs)`: int32 `RaggedTensor [texts, (candidates),
    (tokens)]`, most likely first, and float32 `RaggedTensor [texts,
    (candidates)]`, each the sum of its pieces' unigram log-probabilities
    (byte-fallback and special pieces count 0). No bos or eos.
    """
    processor = _unigram_processor(model_proto)
    piece_log_probs = np.array(
        [processor.get_score(i) for i in range(processor.get_piece_size())], np.float32)
    # Compact arrays, and the texts a chunk at a time: Python lists of every
    # candidate's ids would take several times the memory of the result.
    values, token_counts = array.array("i"), array.array("q")
    candidate_counts, scores = array.array("q"), array.array("f")
    texts = list(texts)
    for start in range(0, len(texts), _CHUNK):
        chunk = processor.nbest_encode(texts[start:start + _CHUNK], nbest_size=nbest,
                                       out_type=int)
        first_value, first_candidate = len(values), len(token_counts)
        for candidates in chunk:
            distinct = list(dict.fromkeys(tuple(c) for c in candidates)) or [()]
            candidate_counts.append(len(distinct))
            for candidate in distinct:
                values.extend(candidate)
                token_counts.append(len(candidate))
        # Slices are copies: a view would stop the arrays from growing.
        lengths = np.frombuffer(token_counts[first_candidate:], np.int64)
        pieces = np.frombuffer(values[first_value:], np.int32)
        # A candidate's log-probability: the sum over its pieces.
        owner = np.repeat(np.arange(len(lengths)), lengths)
        scores.extend(np.bincount(owner, piece_log_probs[pieces], len(lengths))
                      .astype(np.float32))
    candidate_counts = np.frombuffer(candidate_counts, np.int64)
    tokens = tf.RaggedTensor.from_row_lengths(
        np.frombuffer(values, np.int32), np.frombuffer(token_counts, np.int64))
    ids = tf.RaggedTensor.from_row_lengths(tokens, candidate_counts)
    log_probs = tf.RaggedTensor.from_row_lengths(np.frombuffer(scores, np.float32),
                                                 candidate_counts)
    return ids, log_probs


def draw(log_probs, alpha, uniform):
    """Index of the candidate that `uniform` (a scalar in [0, 1)) picks when
    candidate `i` has probability `exp(alpha * log_probs[i])`, normalised."""
    weights = tf.exp(alpha * (log_probs - tf.reduce_max(log_probs)))
    cumulative = tf.cumsum(weights)
    index = tf.searchsorted(cumulative, tf.reshape(uniform * cumulative[-1], [1]),
                            side="right")[0]
    return tf.minimum(index, tf.size(log_probs, out_type=index.dtype) - 1)


def sampled_pairs(pairs, sampling, tokenizer, target_tokenizer, seed, shuffle_and_repeat):
    """`(source_text, target_text)` pairs -> `(source_ids, target_input_ids,
    target_output_ids)` (int32 `(len,)`: source + eos, bos + target, target
    + eos, as `batching.tokenize_pairs`), each side's segmentation drawn
    anew every time the pair comes round.

    Args:
        pairs: a finite `tf.data.Dataset` of string pairs; read once here.
        sampling: a `SubwordSampling`.
        tokenizer, target_tokenizer: the sides' `SubwordTokenizer`s (the
            same one for a shared vocabulary); unigram models.
        seed: int; with the same pairs and arguments the stream of drawn
            segmentations is the same.
        shuffle_and_repeat: `dataset -> dataset`, applied to the candidate
            lists before drawing.
    """
    sources, targets = [], []
    for source, target in pairs.as_numpy_iterator():
        sources.append(source.decode("utf-8"))
        targets.append(target.decode("utf-8"))
    source_ids, source_log_probs = nbest_segmentations(
        tokenizer.model_proto, sources, sampling.nbest)
    target_ids, target_log_probs = nbest_segmentations(
        target_tokenizer.model_proto, targets, sampling.nbest)
    candidates = tf.data.Dataset.from_tensor_slices(
        (source_ids, source_log_probs, target_ids, target_log_probs))
    alpha = tf.constant(sampling.alpha, tf.float32)
    seed = tf.constant(0 if seed is None else seed, tf.int64)
    source_eos = tf.constant([tokenizer.eos_id], tf.int32)
    bos = tf.constant([target_tokenizer.bos_id], tf.int32)
    eos = tf.constant([target_tokenizer.eos_id], tf.int32)

    def choose(position, element):
        source_ids, source_log_probs, target_ids, target_log_probs = element
        uniform = tf.random.stateless_uniform([2], seed=tf.stack([seed, position]))
        source = source_ids[draw(source_log_probs, alpha, uniform[0])]
        target = target_ids[draw(target_log_probs, alpha, uniform[1])]
        return (tf.concat([source, source_eos], 0), tf.concat([bos, target], 0),
                tf.concat([target, eos], 0))

    return shuffle_and_repeat(candidates).enumerate().map(
        choose, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
