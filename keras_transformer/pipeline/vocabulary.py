"""The vocabularies of a new training run: given SentencePiece models, an
`init_from` run's, or trained on the training data (paper 3.4: one shared
vocabulary by default)."""

from keras_transformer.data.batching import check_special_ids
from keras_transformer.data.sources import sentences_for_vocabulary
from keras_transformer.tokenizer import SubwordTokenizer, train_sentencepiece


def vocabularies(config, corpus, init_run=None):
    """`(source_tokenizer, target_tokenizer)` of a new run (one object twice
    for a shared vocabulary): the `init_run`'s (a `RunDirectory` fine-tuned
    from), the files `config.vocab` or `config.src_vocab`/`config.tgt_vocab`,
    or trained on up to `config.vocab_sentences` pairs of `corpus`'s
    training split. Raises `ValueError` naming the files where they
    disagree with each other or with `init_run`'s."""
    given = None
    if config.vocab:
        shared = SubwordTokenizer.from_file(config.vocab)
        given = (shared, shared)
    elif config.src_vocab:
        source = SubwordTokenizer.from_file(config.src_vocab)
        target = SubwordTokenizer.from_file(config.tgt_vocab)
        if source.model_proto == target.model_proto:
            target = source
        try:
            check_special_ids(source, target)
        except ValueError as e:
            raise ValueError(f"--src-vocab {config.src_vocab}, --tgt-vocab {config.tgt_vocab}: "
                             f"{e}") from None
        given = (source, target)
    if init_run is not None:
        trained = init_run.load_tokenizers()
        if given is not None:
            for side, mine, theirs in zip(("source", "target"), given, trained):
                if mine.model_proto != theirs.model_proto:
                    raise ValueError(
                        f"--init-from {config.init_from}: its {side} vocabulary "
                        f"({theirs.vocab_size} ids) is not the one given "
                        f"({mine.vocab_size} ids); a fine-tuned model keeps its vocabulary.")
        return trained
    if given is not None:
        return given
    sizes = ((config.src_vocab_size or config.vocab_size, "source"),
             (config.tgt_vocab_size or config.vocab_size, "target")) if config.separate_vocab \
        else ((config.vocab_size, "both"),)
    made = []
    for size, side in sizes:
        what = "shared" if side == "both" else side
        print(f"Training a {size}-piece {what} vocabulary on up to {config.vocab_sentences} "
              f"training pairs ({corpus.describe('train')}) ...", flush=True)
        sentences = sentences_for_vocabulary(corpus.pairs("train"), config.vocab_sentences,
                                             side=side)
        made.append(SubwordTokenizer(train_sentencepiece(
            sentences, size, model_type=config.vocab_model_type,
            character_coverage=config.character_coverage)))
    return (made[0], made[0]) if len(made) == 1 else tuple(made)


def subword_sampling(config, source_tokenizer, target_tokenizer):
    """The `SubwordSampling` that `config.subword_sampling` asks for (None
    without it); ValueError naming the flag where a vocabulary is not
    unigram."""
    if config.subword_sampling is None:
        return None
    from keras_transformer.data.subword_sampling import SubwordSampling, check_unigram
    from keras_transformer.pipeline.settings import DEFAULT_SUBWORD_NBEST

    for tokenizer in {id(t): t for t in (source_tokenizer, target_tokenizer)}.values():
        try:
            check_unigram(tokenizer.model_proto)
        except ValueError as e:
            raise ValueError(f"--subword-sampling: {e}") from None
    return SubwordSampling(config.subword_sampling,
                           config.subword_nbest or DEFAULT_SUBWORD_NBEST)
