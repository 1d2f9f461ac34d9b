import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.data import batching
from keras_transformer.data.subword_sampling import SubwordSampling
from keras_transformer.tokenizer import SubwordTokenizer, train_sentencepiece
from keras_transformer.training.strategy import make_strategy

WORDS = "the a dog cat house runs sees big small red blue green old new man woman boat".split()


def corpus(n, seed=0, max_words=40):
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(n):
        k = int(rng.integers(1, max_words))
        pairs.append((" ".join(rng.choice(WORDS, k)), " ".join(rng.choice(WORDS, int(rng.integers(1, max_words))))))
    return pairs


@pytest.fixture
def tokenizer():
    # Function scope: the autouse seeding fixture destroys eager resources.
    text = [s for pair in corpus(200, seed=9) for s in pair]
    return SubwordTokenizer(train_sentencepiece(text, vocab_size=400))


def as_dataset(pairs):
    return tf.data.Dataset.from_tensor_slices(([s for s, _ in pairs], [t for _, t in pairs]))


def test_bucket_boundaries_and_sizes():
    boundaries = batching.bucket_boundaries(50, min_boundary=8, growth=1.5)
    assert boundaries == [8, 12, 18, 27, 40, 51]
    assert batching.bucket_batch_sizes(boundaries, 100) == [14, 9, 5, 3, 2, 2, 1]
    with pytest.raises(ValueError, match=r"`batch_tokens` \(30\) must be at least .* \(50\)"):
        batching.bucket_batch_sizes(boundaries, 30)


def test_batches_respect_the_budget_and_every_pair_is_counted(tokenizer):
    pairs = corpus(300)
    max_length, budget = 24, 128
    source_lengths = tokenizer.tokenize(tf.constant([s for s, _ in pairs])).row_lengths() + 1
    target_lengths = tokenizer.tokenize(tf.constant([t for _, t in pairs])).row_lengths() + 1
    expected_kept = [pair for pair, ns, nt in zip(pairs, source_lengths, target_lengths)
                     if max(ns, nt) <= max_length]
    assert 0 < len(expected_kept) < len(pairs)  # the test exercises both outcomes

    length_filter = batching.LengthFilter(max_length)
    dataset = batching.token_batches(as_dataset(pairs), tokenizer, budget, max_length,
                                     length_filter, shuffle_buffer=64, seed=3)
    seen, sizes = [], set()
    pad, bos, eos = tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id
    for (source, target_in), target_out in dataset.as_numpy_iterator():
        assert source.dtype == target_in.dtype == target_out.dtype == np.int32
        assert source.size <= budget and target_out.size <= budget
        assert source.shape[1] <= max_length and target_out.shape[1] <= max_length
        assert target_in.shape == target_out.shape
        sizes.add(source.shape[0])
        for s, ti, to in zip(source, target_in, target_out):
            s, ti, to = s[s != pad], ti[ti != pad], to[to != pad]
            assert s[-1] == eos and to[-1] == eos and ti[0] == bos
            np.testing.assert_array_equal(ti[1:], to[:-1])  # shifted right behind bos
        texts = zip(tokenizer.detokenize(source).numpy(), tokenizer.detokenize(target_out).numpy())
        seen += [(s.decode(), t.decode()) for s, t in texts]
    assert len(sizes) > 1  # different lengths, different sentence counts
    assert sorted(seen) == sorted(expected_kept)
    counts = length_filter.counts()
    assert counts == {"kept": len(expected_kept), "dropped": len(pairs) - len(expected_kept)}


def test_length_filter_must_match_and_be_outside_a_strategy(tokenizer):
    with pytest.raises(ValueError, match="differs"):
        batching.token_batches(as_dataset(corpus(4)), tokenizer, 64, 16, batching.LengthFilter(20))
    with tf.distribute.OneDeviceStrategy("CPU:0").scope():
        with pytest.raises(RuntimeError, match="outside `strategy.scope"):
            batching.LengthFilter(16)


def test_caching_the_tokenized_pairs_gives_the_same_batches(tokenizer):
    # Shuffling tokenized pairs with the same seed gives the order that
    # shuffling the text did, epoch after epoch (a demo run's final weights
    # are bit-identical with and without the cache).
    pairs = as_dataset(corpus(300, seed=3))
    runs = []
    for cache in (False, True):
        ds = batching.token_batches(pairs, tokenizer, batch_tokens=300, max_length=64,
                                    shuffle_buffer=120, seed=5, repeat=True,
                                    cache_tokenized=cache)
        runs.append([[t.numpy() for t in (s, ti, to)] for (s, ti), to in ds.take(150)])
    batches = sum(len(b[0]) for b in runs[0])
    assert batches > 2 * 300  # several passes over the pairs: the cache was reused
    for plain, cached in zip(*runs):
        for a, b in zip(plain, cached):
            np.testing.assert_array_equal(a, b)


def test_passes_do_not_autotune_and_a_stream_chooses(tokenizer):
    # Deleting an autotuned iterator waits for its autotuning thread's sleep
    # (up to a minute), and Keras deletes one at every validation or epoch.
    pairs = as_dataset(corpus(60, seed=4))
    passes = batching.token_batches(pairs, tokenizer, batch_tokens=300, max_length=64)
    assert passes.options().autotune.enabled is False
    forever = batching.token_batches(pairs, tokenizer, batch_tokens=300, max_length=64,
                                     repeat=True)
    assert forever.options().autotune.enabled is not False
    # Either can be chosen (kt-train --input-autotune): off spares a short
    # run the wait when fit deletes its training iterator.
    for repeat, autotune in ((True, False), (False, True)):
        chosen = batching.token_batches(pairs, tokenizer, batch_tokens=300, max_length=64,
                                        repeat=repeat, autotune=autotune)
        assert (chosen.options().autotune.enabled is not False) == autotune
    # A user's script chooses it through the library's pipeline too.
    from keras_transformer.data.translation import translation_dataset

    for autotune in (None, False):
        script = translation_dataset(corpus(20, seed=4), tokenizer, batch_tokens=300,
                                     max_length=64, repeat=True, autotune=autotune)
        assert (script.options().autotune.enabled is not False) == (autotune is None)
    # Two passes give the same batches, every pair in each.
    first = batch_arrays(passes)
    assert sum(len(b[0]) for b in first) == 60
    assert_same_batches(first, batch_arrays(passes))


def test_one_device_gives_keras_the_dataset_itself(tokenizer):
    # No MultiDeviceIterator in between: its per-device iterator is always
    # autotuned, whatever the dataset's options, and Keras deletes one at
    # every validation.
    strategy = make_strategy("one_device")
    pairs = as_dataset(corpus(60, seed=4))
    passes = batching.distributed_dataset(
        strategy, lambda context: batching.token_batches(pairs, tokenizer, 300, 64))
    assert isinstance(passes, tf.data.Dataset)
    assert passes.options().autotune.enabled is False
    assert sum(len(b[0]) for b in batch_arrays(passes)) == 60


def test_fixed_shapes_give_one_shape_per_bucket_and_the_same_pairs(tokenizer):
    # For XLA: each bucket's batches take exactly one shape, the last one
    # filled with all-padding rows, and no pair is lost or changed.
    pairs = corpus(300, seed=4)
    max_length, budget = 24, 128
    boundaries = batching.bucket_boundaries(max_length)
    allowed = {(budget // (b - 1), b - 1) for b in boundaries}
    runs = []
    for fixed in (False, True):
        dataset = batching.token_batches(as_dataset(pairs), tokenizer, budget, max_length,
                                         fixed_shapes=fixed)
        shapes, seen, filled = set(), [], 0
        for (source, target_in), target_out in dataset.as_numpy_iterator():
            assert source.shape == target_in.shape == target_out.shape or not fixed
            shapes.add(source.shape)
            real = (source != tokenizer.pad_id).any(1)
            assert real.any()
            if fixed:
                # Filled rows are padding on every side, and come last.
                assert not (target_out[~real] != tokenizer.pad_id).any()
                assert real[: real.sum()].all()
                filled += (~real).sum()
            texts = zip(tokenizer.detokenize(source[real]).numpy(),
                        tokenizer.detokenize(target_out[real]).numpy())
            seen += [(s.decode(), t.decode()) for s, t in texts]
        runs.append((shapes, sorted(seen), filled))
    (free_shapes, free_pairs, _), (fixed_shapes, fixed_pairs, filled) = runs
    assert fixed_pairs == free_pairs and len(free_pairs) > 100
    assert fixed_shapes <= allowed and len(fixed_shapes) > 3
    assert len(free_shapes) > len(fixed_shapes)  # what XLA would have compiled
    assert filled > 0  # the buckets' last batches were filled


def batch_arrays(dataset, count=None):
    """The batches as lists of three numpy arrays (source, target in, target out)."""
    dataset = dataset if count is None else dataset.take(count)
    return [[t.numpy() for t in (s, ti, to)] for (s, ti), to in dataset]


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            np.testing.assert_array_equal(u, v)


def test_a_separate_target_vocabulary_tokenizes_the_target_side(tokenizer):
    pairs = corpus(120, seed=6, max_words=12)
    # Targets in other words, so the two vocabularies differ.
    pairs = [(s, t.replace("the", "der").replace("dog", "Hund")) for s, t in pairs]
    target_tokenizer = SubwordTokenizer(train_sentencepiece([t for _, t in pairs], vocab_size=400))
    assert target_tokenizer.model_proto != tokenizer.model_proto
    dataset = batching.token_batches(as_dataset(pairs), tokenizer, 256, 32,
                                     target_tokenizer=target_tokenizer)
    rows, seen = [], []
    for (source, target_in), target_out in dataset.as_numpy_iterator():
        texts = zip(tokenizer.detokenize(source).numpy(),
                    target_tokenizer.detokenize(target_out).numpy())
        seen += [(s.decode(), t.decode()) for s, t in texts]
        for s, ti, to in zip(source, target_in, target_out):
            pad = tokenizer.pad_id
            s, ti, to = s[s != pad], ti[ti != pad], to[to != pad]
            assert s[-1] == to[-1] == target_tokenizer.eos_id
            np.testing.assert_array_equal(ti, np.concatenate([[target_tokenizer.bos_id], to[:-1]]))
            rows.append((s[:-1].tolist(), to[:-1].tolist()))
    # Each side holds its own vocabulary's ids for its text.
    assert [s for s, _ in rows] == tokenizer.tokenize([s for s, _ in seen]).to_list()
    assert [t for _, t in rows] == target_tokenizer.tokenize([t for _, t in seen]).to_list()
    assert sorted(seen) == sorted(pairs)
    # The target vocabulary's ids differ from the shared one's for the same text.
    text = tf.constant(["der Hund"])
    assert tokenizer.tokenize(text).to_list() != target_tokenizer.tokenize(text).to_list()


def test_the_same_vocabulary_given_twice_gives_the_shared_batches(tokenizer):
    pairs = as_dataset(corpus(200, seed=8))
    twin = SubwordTokenizer(tokenizer.model_proto)  # another object, the same model
    shared = batch_arrays(batching.token_batches(pairs, tokenizer, 300, 64, shuffle_buffer=50,
                                                 seed=2))
    both = batch_arrays(batching.token_batches(pairs, tokenizer, 300, 64, shuffle_buffer=50,
                                               seed=2, target_tokenizer=twin))
    assert len(shared) > 5
    assert_same_batches(shared, both)


def test_vocabularies_with_different_special_ids_are_refused(tokenizer):
    import io

    import sentencepiece

    buffer = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter([t for _, t in corpus(200, seed=2)]), model_writer=buffer,
        vocab_size=40, hard_vocab_limit=False, minloglevel=2)  # unk 0, bos 1, eos 2, no pad
    other = SubwordTokenizer(buffer.getvalue())
    pairs = as_dataset(corpus(4))
    message = (rf"different special ids \(pad 0 vs {other.pad_id}, bos 2 vs 1, eos 3 vs 2; "
               r"source vs target\)")
    with pytest.raises(ValueError, match=message):
        batching.token_batches(pairs, tokenizer, 64, 16, target_tokenizer=other)
    with pytest.raises(ValueError, match=message):
        batching.tokenize_pairs(pairs, tokenizer, target_tokenizer=other)


@pytest.mark.parametrize("cache, sampling", [(False, None), (True, None),
                                             (False, SubwordSampling(0.2, 8))])
def test_skipping_batches_resumes_the_stream_exactly(tokenizer, cache, sampling):
    # A resumed run (same pairs, seed, arguments) skips what it trained on
    # and sees what an uninterrupted run saw next, across epoch boundaries;
    # with subword sampling, the same segmentations too.
    pairs = as_dataset(corpus(150, seed=11))

    def stream(skip=0):
        return batching.token_batches(pairs, tokenizer, batch_tokens=300, max_length=64,
                                      shuffle_buffer=60, seed=7, repeat=True,
                                      cache_tokenized=cache, skip_batches=skip,
                                      subword_sampling=sampling)

    whole = batch_arrays(stream(), 130)
    assert sum(len(b[0]) for b in whole) > 2 * 150  # past the first epochs
    for skip in (1, 17, 100):
        assert_same_batches(batch_arrays(stream(skip), 30), whole[skip:skip + 30])


@pytest.mark.parametrize("sampling", [None, SubwordSampling(0.2, 8)])
def test_the_shuffled_stream_is_deterministic_for_a_seed(tokenizer, sampling):
    pairs = as_dataset(corpus(150, seed=12))

    def stream(seed):
        return batch_arrays(batching.token_batches(
            pairs, tokenizer, batch_tokens=300, max_length=64, shuffle_buffer=60, seed=seed,
            repeat=True, subword_sampling=sampling), 60)

    first = stream(3)
    assert_same_batches(first, stream(3))
    with pytest.raises(AssertionError):  # the seed matters: the test can tell streams apart
        assert_same_batches(first, stream(4))


@pytest.mark.parametrize("skip", [-1, 1.5, True, "2"])
def test_skip_batches_must_be_a_count(tokenizer, skip):
    with pytest.raises(ValueError, match=r"`skip_batches` must be an int >= 0"):
        batching.token_batches(as_dataset(corpus(4)), tokenizer, 64, 16, skip_batches=skip)
