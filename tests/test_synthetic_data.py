import numpy as np

import keras_transformer as kt
from keras_transformer.data.synthetic import (
    SyntheticLanguage,
    generate_corpus,
    swap_subject_and_object,
)


def test_deterministic_from_the_seed():
    a = generate_corpus(seed=3, num_train=200, num_val=20, num_test=20)
    b = generate_corpus(seed=3, num_train=200, num_val=20, num_test=20)
    c = generate_corpus(seed=4, num_train=200, num_val=20, num_test=20)
    assert a == b
    assert a["train"] != c["train"]


def test_held_out_sentences_never_occur_in_training():
    corpus = generate_corpus(seed=0, num_train=5000, num_val=300, num_test=300)
    train = set(corpus["train"][0])
    assert not train & set(corpus["test"][0])
    assert not train & set(corpus["val"][0])
    assert not set(corpus["val"][0]) & set(corpus["test"][0])
    assert len(set(corpus["test"][0])) == 300


def test_has_the_difficulties_of_real_translation():
    corpus = generate_corpus(seed=0, num_train=5000, num_val=10, num_test=10)
    sources, targets = corpus["train"]
    source_words = {w for s in sources for w in s.split()}
    target_words = {w for t in targets for w in t.split()}
    assert len(source_words) > 300 and len(target_words) > 600  # several hundred words
    lengths = [len(s.split()) for s in sources]
    assert min(lengths) <= 5 and max(lengths) >= 25  # variable lengths
    language = SyntheticLanguage(0)
    # Agreement: one adjective, three genders/cases -> several surface forms.
    forms = {w for t in targets for w in t.split() if w.startswith(language.adjectives["big"])}
    assert len(forms) >= 4
    # Reordering: the verb comes last in the target (before an optional negation).
    clause = "the dog sees the big cat"
    target = [t for s, t in zip(sources, targets) if s == clause]
    verb = language.verbs["see"] + language.verb_suffix["sg"]
    assert all(t.split()[-1] == verb for t in target)


def test_word_order_carries_meaning():
    pairs = swap_subject_and_object(seed=0, count=20)
    for source_a, target_a, source_b, target_b in pairs:
        assert sorted(source_a.split()) == sorted(source_b.split())
        assert target_a != target_b


def test_without_positions_the_model_cannot_tell_the_pair_apart():
    """Without positional encoding the encoder is permutation-equivariant and
    encoder-decoder attention is permutation-invariant, so both sentences of
    a subject/object swap get the same output distribution: at least one of
    the two (different) translations must be wrong, whatever the training."""
    vocab = {w: i + 4 for i, w in enumerate(sorted(
        {w for p in swap_subject_and_object(0, 5) for s in (p[0], p[2]) for w in s.split()}))}
    target_in = np.array([[2, 7, 9, 11]], "int32")
    for position_encoding, same in (("none", True), ("sinusoidal", False)):
        config = kt.get_config("tiny", vocab_size=len(vocab) + 4, dropout=0.0,
                               position_encoding=position_encoding)
        model = kt.Transformer(config)
        for source_a, _, source_b, _ in swap_subject_and_object(0, 5):
            a = np.array([[vocab[w] for w in source_a.split()] + [3]], "int32")
            b = np.array([[vocab[w] for w in source_b.split()] + [3]], "int32")
            logits_a, logits_b = model((a, target_in)), model((b, target_in))
            assert np.allclose(logits_a, logits_b, atol=1e-5) == same
