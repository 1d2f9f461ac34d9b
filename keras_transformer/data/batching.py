"""From text pairs to token-budgeted training batches (paper section 5.1).
TensorFlow-only module.

    pairs (text, text)
      -> shuffle (optional), repeat (optional)
      -> tokenize in the graph (tensorflow_text SentencePiece: the run's
         shared vocabulary, or a source and a target one)
      -> source = tokens + eos; target_input = bos + tokens;
         target_output = tokens + eos
      -> drop pairs longer than `max_length` on either side, counted by a
         `LengthFilter`
      -> length buckets; a bucket whose sequences are at most L tokens long
         is batched `batch_tokens // L` sentences at a time, so every batch
         holds at most `batch_tokens` source and `batch_tokens` target
         positions, padding included
      -> pad with the tokenizer's pad id
      -> skip the batches a resumed run already trained on (optional)
      -> ((source_ids (batch, src_len), target_input_ids (batch, tgt_len)),
          target_ids (batch, tgt_len)), int32, ready for `model.fit`.

The paper's batches held ~25,000 source and ~25,000 target tokens over 8
GPUs. Under `tf.distribute` each replica gets its own bucketed batch
(`distributed_dataset`), so `batch_tokens` is per replica and per step; the
effective batch is `batch_tokens x replicas x gradient-accumulation steps`.
"""

import tensorflow as tf

from keras_transformer.data.subword_sampling import sampled_pairs


class LengthFilter(tf.Module):
    """Keeps pairs whose source and target are at most `max_length` tokens
    (eos/bos included) and counts what it keeps and drops.

    The counts are variables updated by the `tf.data` pipeline as it runs, so
    nothing is dropped silently: `kept + dropped` is every pair read so far
    (per worker under multi-worker training). Create it outside any
    `strategy.scope()` (its counters are plain host variables).

    Args:
        max_length: longest allowed sequence in tokens.
    """

    def __init__(self, max_length, name=None):
        super().__init__(name=name)
        if not isinstance(max_length, int) or max_length < 2:
            raise ValueError(f"`max_length` must be an int >= 2, received {max_length!r}.")
        if tf.distribute.has_strategy():
            raise RuntimeError(
                "Create the LengthFilter outside `strategy.scope()`: its counters must be "
                "plain host variables, not distributed ones."
            )
        self.max_length = max_length
        with tf.device("/CPU:0"):
            self.kept = tf.Variable(0, dtype=tf.int64, trainable=False, name="kept")
            self.dropped = tf.Variable(0, dtype=tf.int64, trainable=False, name="dropped")

    def __call__(self, source_ids, target_output_ids):
        """Scalar bool: keep this pair? Updates the counters."""
        keep = tf.logical_and(
            tf.size(source_ids) <= self.max_length, tf.size(target_output_ids) <= self.max_length
        )
        with tf.control_dependencies([
            self.kept.assign_add(tf.cast(keep, tf.int64)),
            self.dropped.assign_add(1 - tf.cast(keep, tf.int64)),
        ]):
            return tf.identity(keep)

    def counts(self):
        """`{"kept": int, "dropped": int}` so far."""
        return {"kept": int(self.kept.numpy()), "dropped": int(self.dropped.numpy())}

    def reset(self):
        self.kept.assign(0)
        self.dropped.assign(0)


def bucket_boundaries(max_length, min_boundary=8, growth=1.1):
    """Length-bucket boundaries: bucket i holds lengths in
    `[boundaries[i-1], boundaries[i])`; the last boundary is `max_length + 1`.

    Geometric spacing (x `growth`, as in Tensor2Tensor) keeps padding within
    ~10% while giving few buckets.
    """
    if max_length < 1:
        raise ValueError(f"`max_length` must be positive, received {max_length}.")
    boundaries = []
    b = min(min_boundary, max_length + 1)
    while b < max_length + 1:
        boundaries.append(b)
        b = max(b + 1, int(b * growth))
    boundaries.append(max_length + 1)
    return boundaries


def bucket_batch_sizes(boundaries, batch_tokens):
    """Sentences per batch for each bucket of `bucket_boundaries`, plus one
    (unused: longer pairs are filtered out) for the overflow bucket:
    `batch_tokens // longest length in the bucket`."""
    longest = boundaries[-1] - 1
    if batch_tokens < longest:
        raise ValueError(
            f"`batch_tokens` ({batch_tokens}) must be at least the maximum sequence length "
            f"({longest}), or a batch of one long pair would exceed the budget."
        )
    return [batch_tokens // (b - 1) if b > 1 else batch_tokens for b in boundaries] + [1]


def check_special_ids(tokenizer, target_tokenizer):
    """Raises ValueError unless both tokenizers have the same pad, bos and
    eos ids: the model has one of each for both sides."""
    if target_tokenizer is None or target_tokenizer is tokenizer:
        return
    differ = [
        f"{name} {getattr(tokenizer, name + '_id')} vs {getattr(target_tokenizer, name + '_id')}"
        for name in ("pad", "bos", "eos")
        if getattr(tokenizer, name + "_id") != getattr(target_tokenizer, name + "_id")
    ]
    if differ:
        raise ValueError(
            "The source and target vocabularies have different special ids "
            f"({', '.join(differ)}; source vs target); the model has one pad, bos and eos "
            "id for both sides. Train both with the same ids (e.g. SentencePiece's "
            "`--pad_id --unk_id --bos_id --eos_id`, as `train_sentencepiece` does)."
        )


def tokenize_pairs(pairs, tokenizer, chunk_size=256, target_tokenizer=None):
    """`(source_text, target_text)` -> `(source_ids, target_input_ids,
    target_output_ids)`, each int32 `(len,)`: source + eos, bos + target,
    target + eos. Tokenizes `chunk_size` sentences per op call.

    The source side is tokenized with `tokenizer`, the target side with
    `target_tokenizer` (None: `tokenizer`, one shared vocabulary); their
    pad, bos and eos ids must agree (ValueError otherwise).
    """
    check_special_ids(tokenizer, target_tokenizer)
    target_tokenizer = tokenizer if target_tokenizer is None else target_tokenizer
    source_eos = tokenizer.eos_id
    bos, eos = target_tokenizer.bos_id, target_tokenizer.eos_id

    def encode(source_text, target_text):
        source = tokenizer.tokenize(source_text)  # RaggedTensor [chunk, (len)]
        target = target_tokenizer.tokenize(target_text)
        rows = source.nrows()
        source_eos_col = tf.fill([rows, 1], tf.constant(source_eos, tf.int32))
        eos_col = tf.fill([rows, 1], tf.constant(eos, tf.int32))
        bos_col = tf.fill([rows, 1], tf.constant(bos, tf.int32))
        parts = (
            tf.concat([source, source_eos_col], axis=1),
            tf.concat([bos_col, target], axis=1),
            tf.concat([target, eos_col], axis=1),
        )
        # Dense rows plus lengths: unbatching a RaggedTensor would give
        # ragged elements, which `padded_batch` does not take.
        return tuple((p.to_tensor(), tf.cast(p.row_lengths(), tf.int32)) for p in parts)

    def trim(*padded_and_lengths):
        return tuple(row[:length] for row, length in padded_and_lengths)

    return (
        pairs.batch(chunk_size)
        .map(encode, num_parallel_calls=tf.data.AUTOTUNE)
        .unbatch()
        .map(trim, num_parallel_calls=tf.data.AUTOTUNE)
    )


def token_batches(
    pairs,
    tokenizer,
    batch_tokens,
    max_length,
    length_filter=None,
    shuffle_buffer=0,
    seed=None,
    repeat=False,
    min_boundary=8,
    growth=1.1,
    cache_tokenized=False,
    fixed_shapes=False,
    target_tokenizer=None,
    skip_batches=0,
    subword_sampling=None,
    autotune=None,
):
    """Token-budgeted, length-bucketed, padded batches for `model.fit`.

    Args:
        pairs: `tf.data.Dataset` of `(source_text, target_text)` strings.
        tokenizer: a `SubwordTokenizer` (pad/bos/eos ids come from it); it
            tokenizes the source side, and the target side too unless
            `target_tokenizer` is given.
        batch_tokens: budget per batch and side, padding included: every
            batch has `batch * src_len <= batch_tokens` and
            `batch * tgt_len <= batch_tokens`.
        max_length: pairs with a longer side (eos/bos included) are dropped
            and counted in `length_filter`.
        length_filter: a `LengthFilter(max_length)` whose counters you read;
            one is created when omitted.
        shuffle_buffer: shuffle pairs with this buffer (0: keep order).
        seed: shuffle seed.
        repeat: repeat the pairs forever (training with `steps_per_epoch`).
            Without it the dataset is read in passes, each with a new
            iterator (validation at every `--validate-every`, Keras epochs).
        cache_tokenized: tokenize the pairs once and keep the ids in memory
            (shuffled and repeated from there), instead of tokenizing every
            epoch. Tokenizing competes with training for the CPU on a
            small machine (docs/performance.md); the cache holds the
            three id tensors of every pair (Multi30k: a few MB; WMT14's
            4.5M pairs: ~1.5 GB), so it is off by default.
        fixed_shapes: one batch shape per bucket, for XLA (which compiles
            the training step once per input shape): both sides are padded
            to the bucket's longest length and a bucket's last, smaller
            batch (only where the pairs do not repeat) is filled with
            all-padding rows, which the loss and metrics ignore. Costs the
            padding; without it a batch is padded to its own longest source
            and target, and every batch may take a new shape.
        target_tokenizer: the target side's `SubwordTokenizer` (separate
            vocabularies); None: `tokenizer`. Its pad, bos and eos ids must
            equal `tokenizer`'s (ValueError otherwise).
        skip_batches: drop the first this many batches of the stream, after
            bucketing: a resumed run given the same pairs, seed and
            arguments plus the number of batches already consumed continues
            with the batches an uninterrupted run would have had next. The
            skipped pairs are still read, tokenized and counted by
            `length_filter`.
        subword_sampling: a `subword_sampling.SubwordSampling`: each side of
            a pair gets a segmentation drawn from its n best every time the
            pair comes round (Kudo 2018; unigram vocabularies only), instead
            of the tokenizer's one. Reads `pairs` once and keeps every
            candidate's ids in memory (so `cache_tokenized` changes
            nothing); the draws are keyed by `seed` and the pair's position
            in the stream.
        autotune: tf.data autotuning of the parallel maps and the prefetch
            buffer; None: on for a repeated stream, off for one read in
            passes. Deleting an autotuned iterator can wait until its
            autotuning thread wakes from a sleep that grows to a minute
            (docs/performance.md), and Keras deletes one at every pass and
            when `fit` returns: off suits passes and short runs, on long
            ones. Off, the prefetch buffer grows by tf.data's own rule and
            the parallel maps make one call per core.

    Returns: a dataset of `((source_ids (batch, src_len), target_input_ids
    (batch, tgt_len)), target_ids (batch, tgt_len))`, int32, padded with
    `tokenizer.pad_id`.
    """
    if isinstance(skip_batches, bool) or not isinstance(skip_batches, int) or skip_batches < 0:
        raise ValueError(f"`skip_batches` must be an int >= 0, received {skip_batches!r}.")
    check_special_ids(tokenizer, target_tokenizer)
    if length_filter is None:
        length_filter = LengthFilter(max_length)
    elif length_filter.max_length != max_length:
        raise ValueError(
            f"`length_filter.max_length` ({length_filter.max_length}) differs from "
            f"`max_length` ({max_length})."
        )
    boundaries = bucket_boundaries(max_length, min_boundary, growth)
    sizes = bucket_batch_sizes(boundaries, batch_tokens)

    def shuffled_and_repeated(dataset):
        if shuffle_buffer:
            dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        return dataset.repeat() if repeat else dataset

    if subword_sampling is not None:
        encoded = sampled_pairs(
            pairs, subword_sampling, tokenizer,
            tokenizer if target_tokenizer is None else target_tokenizer, seed,
            shuffled_and_repeated)
    elif cache_tokenized:
        encoded = shuffled_and_repeated(
            tokenize_pairs(pairs, tokenizer, target_tokenizer=target_tokenizer).cache())
    else:
        encoded = tokenize_pairs(shuffled_and_repeated(pairs), tokenizer,
                                 target_tokenizer=target_tokenizer)
    encoded = encoded.filter(lambda s, ti, to: length_filter(s, to))
    pad = tf.constant(tokenizer.pad_id, tf.int32)
    batches = encoded.bucket_by_sequence_length(
        element_length_func=lambda s, ti, to: tf.maximum(tf.size(s), tf.size(to)),
        bucket_boundaries=boundaries,
        bucket_batch_sizes=sizes,
        padded_shapes=([None], [None], [None]),
        padding_values=(pad, pad, pad),
        pad_to_bucket_boundary=fixed_shapes,
        drop_remainder=False,
    )
    if fixed_shapes:
        # Every side of bucket i is now `boundaries[i] - 1` long; fill the
        # batch to that bucket's own size in `sizes`.
        size_at_length = [0] * boundaries[-1]
        for boundary, size in zip(boundaries, sizes):
            size_at_length[boundary - 1] = size
        size_at_length = tf.constant(size_at_length, tf.int32)

        def fill_rows(*sides):
            rows, length = tf.unstack(tf.shape(sides[0]))
            missing = tf.gather(size_at_length, length) - rows
            return tuple(tf.pad(x, [[0, missing], [0, 0]], constant_values=pad) for x in sides)

        batches = batches.map(fill_rows)
    if autotune is None:
        autotune = repeat
    if skip_batches:
        batches = batches.skip(skip_batches)
    batches = batches.map(lambda s, ti, to: ((s, ti), to)).prefetch(tf.data.AUTOTUNE)
    if not autotune:
        options = tf.data.Options()
        options.autotune.enabled = False
        batches = batches.with_options(options)
    return batches


def distributed_dataset(strategy, dataset_fn):
    """Each replica gets its own token-bucketed batch.

    Args:
        strategy: a `tf.distribute.Strategy`.
        dataset_fn: `(input_context) -> dataset` of per-replica batches
            (e.g. `token_batches` over `pairs.shard(input_context.
            num_input_pipelines, input_context.input_pipeline_id)`).

    Returns: a distributed dataset for `model.fit` (batch sizes may differ
    between replicas; the loss is normalised by the global token count in
    `Transformer.compute_loss`).
    """
    options = tf.distribute.InputOptions(experimental_fetch_to_device=True)
    return strategy.distribute_datasets_from_function(dataset_fn, options)
