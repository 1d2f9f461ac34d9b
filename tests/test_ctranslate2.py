"""The CTranslate2 export and engine (keras_transformer/export/ctranslate2.py)
against the Keras model, and kt-export --format ctranslate2 / kt-translate
--ctranslate2-model on a hand-made run directory.

Exactness: teacher-forced log-probabilities of every config variant agree
with the Keras model's to float32 rounding; greedy search gives the
package's tokens; beam search at alpha 0 gives the package's best
hypothesis wherever neither search reached the length limit (the two treat
a hypothesis cut at the limit differently: docs/decoding-and-serving.md).
"""

import contextlib
import io
import json
import os
import sys

import keras
import numpy as np
import pytest
import sentencepiece

ctranslate2 = pytest.importorskip(
    "ctranslate2", reason="the CTranslate2 export needs the ctranslate2 package "
    "(pip install 'ctranslate2>=4.5', in the test extra)")

import keras_transformer as kt
from keras_transformer.decoding import beam_search_translate, greedy_translate
from keras_transformer.export.ctranslate2 import (
    METADATA_FILE,
    SentencePieceVocabulary,
    export_ctranslate2,
    read_ctranslate2_metadata,
)
from keras_transformer.export.ctranslate2_translator import (
    CTranslate2Translator,
    decoding_limit,
)
from keras_transformer.tokenizer import train_sentencepiece
from test_tokenizer import CORPUS

# Sources and targets: the corpus's sentences and a few it never saw.
SENTENCES = sorted(set(CORPUS)) + [
    "Ein Hund fährt über die Straße.",
    "The bridge crosses two streets while the girls play.",
    "Schnee!",
]
MAX_LENGTH = 96
EXTRA_LENGTH = 6


def default_ids_model(sentences):
    """A SentencePiece model with SentencePiece's own special ids (unk 0,
    bos 1, eos 2) and no pad piece: the package adds a pad id."""
    buffer = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=buffer, vocab_size=300,
        byte_fallback=True, hard_vocab_limit=False, minloglevel=2)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def vocabularies():
    return {
        "shared": train_sentencepiece(CORPUS, vocab_size=400),
        "bpe": train_sentencepiece(CORPUS, vocab_size=400, model_type="bpe"),
        "default_ids": default_ids_model(CORPUS),
    }


# variant -> (source vocabulary, target vocabulary or None, config overrides)
VARIANTS = {
    "post_ln": ("shared", None, {}),
    "pre_ln": ("shared", None, {"norm_first": True}),
    "separate_vocabularies": ("shared", "bpe", {}),
    "untied_output": ("shared", None, {"tie_output_projection": False}),
    "learned_positions": ("shared", None, {"position_encoding": "learned"}),
    "no_positions": ("shared", None, {"position_encoding": "none"}),
    # An added pad id, two rows past the tokenizer, a large epsilon (so
    # that a wrong one shows in the log-probabilities), 3 decoder layers.
    "added_pad": ("default_ids", None, {"layer_norm_epsilon": 0.1,
                                        "num_decoder_layers": 3, "extra_rows": 2}),
}


def randomize(model, seed):
    """Every weight that starts constant (biases, LayerNorm scales and
    offsets) gets noise, so that each one matters to the outputs."""
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        value = keras.ops.convert_to_numpy(weight)
        if np.all(value == value.flat[0]):
            weight.assign(value + rng.normal(0.0, 0.2, value.shape).astype(value.dtype))


def build(vocabularies, variant, seed=0):
    """`(model, source SentencePieceVocabulary, target ...)` for `variant`."""
    source_name, target_name, overrides = VARIANTS[variant]
    overrides = dict(overrides)
    extra_rows = overrides.pop("extra_rows", 0)
    source = SentencePieceVocabulary(vocabularies[source_name])
    target = SentencePieceVocabulary(vocabularies[target_name]) if target_name else source
    config = kt.get_config(
        "tiny", vocab_size=source.vocab_size + extra_rows, dropout=0.0, max_length=MAX_LENGTH,
        target_vocab_size=target.vocab_size if target_name else None,
        pad_id=source.pad_id, bos_id=source.bos_id, eos_id=source.eos_id, **overrides)
    keras.utils.set_random_seed(seed)
    model = kt.Transformer(config)
    model.build()
    randomize(model, seed)
    return model, source, target


@pytest.fixture(scope="module")
def exports(vocabularies, tmp_path_factory):
    """variant -> (model, source, target, export directory), built on first use."""
    root = tmp_path_factory.mktemp("ct2")
    built = {}

    def get(variant):
        if variant not in built:
            model, source, target = build(vocabularies, variant)
            path = export_ctranslate2(model, source.model_proto, target.model_proto,
                                      str(root / variant))
            built[variant] = (model, source, target, path)
        return built[variant]

    return get


def pieces(vocabulary, text):
    return vocabulary.processor.encode(text, out_type=str)


def ids(vocabulary, text):
    return vocabulary.processor.encode(text)


def keras_log_probs(model, source_ids, target_ids):
    """Teacher-forced log P of each target id and of eos, per sentence, from
    one padded batch through `model((source_ids, target_input_ids))`."""
    config = model.config
    sources = [s + [config.eos_id] for s in source_ids]
    inputs = [[config.bos_id] + t for t in target_ids]
    labels = [t + [config.eos_id] for t in target_ids]

    def pad(rows):
        width = max(map(len, rows))
        return np.array([r + [config.pad_id] * (width - len(r)) for r in rows], np.int32)

    logits = keras.ops.convert_to_numpy(model((pad(sources), pad(inputs)), training=False))
    logits = logits.astype(np.float64)
    log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(
        -1, keepdims=True)) - logits.max(-1, keepdims=True)
    return [log_probs[i, np.arange(len(t)), t] for i, t in enumerate(labels)]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_teacher_forced_log_probs_match_the_keras_model(exports, variant):
    model, source, target, path = exports(variant)
    translator = CTranslate2Translator(path)
    assert translator.compute_type == "float32"
    sources = SENTENCES
    targets = SENTENCES[3:] + SENTENCES[:3]
    expected = keras_log_probs(model, [ids(source, s) for s in sources],
                               [ids(target, t) for t in targets])
    got = translator.score([pieces(source, s) for s in sources],
                           [pieces(target, t) for t in targets])
    worst = 0.0
    for e, g in zip(expected, got):
        assert g.shape == e.shape
        worst = max(worst, float(np.max(np.abs(g - e))))
    print(f"{variant}: max |delta log P| = {worst:.2e}")
    # float32 rounding through a few layers of width 64: about 1e-6 of
    # log-probabilities of magnitude ~10.
    assert worst <= 1e-4


def test_the_export_directory_and_its_metadata(exports):
    model, source, _, path = exports("added_pad")
    assert sorted(os.listdir(path)) == sorted(
        ["model.bin", "config.json", "shared_vocabulary.json", "shared.spm", METADATA_FILE])
    metadata = read_ctranslate2_metadata(path)
    assert metadata["config"] == model.config.to_dict()
    assert metadata["quantization"] == "float32"
    assert metadata["shared_vocabulary"] is True
    special = metadata["special_tokens"]
    assert special["added_pad"] == {"source": True, "target": True}
    assert special["source"]["pad"] == {"id": source.piece_count, "piece": "<pad>"}
    assert special["source"]["eos"] == {"id": 2, "piece": "</s>"}
    with open(os.path.join(path, "shared_vocabulary.json"), encoding="utf-8") as f:
        vocabulary = json.load(f)
    # The model's ids: the pieces, the added pad, then rows past the tokenizer.
    assert len(vocabulary) == model.config.vocab_size == source.piece_count + 3
    assert vocabulary[source.piece_count:] == [
        "<pad>", f"<unused_{source.piece_count + 1}>", f"<unused_{source.piece_count + 2}>"]
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert config["add_source_eos"] is True and config["add_source_bos"] is False
    assert config["decoder_start_token"] == "<s>" and config["layer_norm_epsilon"] == 0.1
    with open(os.path.join(path, "shared.spm"), "rb") as f:
        assert f.read() == source.model_proto


def test_separate_vocabularies_are_two_files(exports):
    _, source, target, path = exports("separate_vocabularies")
    names = set(os.listdir(path))
    assert {"source.spm", "target.spm", "source_vocabulary.json",
            "target_vocabulary.json"} <= names and "shared.spm" not in names
    with open(os.path.join(path, "target.spm"), "rb") as f:
        assert f.read() == target.model_proto


def package_ids(sequence, eos_id, pad_id):
    """A search's row -> its tokens before eos (the whole row when the limit
    cut it), as a list."""
    out = []
    for token in np.asarray(sequence).tolist():
        if token == eos_id:
            return out, True
        out.append(token)
    while out and out[-1] == pad_id:
        out.pop()
    return out, False


@pytest.fixture(scope="module")
def eos_model(vocabularies, tmp_path_factory):
    """`(model, source vocabulary, export)`: the untied variant (another
    seed) with its output bias for eos raised by the lower quartile of the
    gaps between the best logit and eos's, so that eos is the argmax at
    about a quarter of the positions: searches end at various lengths, some
    before the limit, some at it (a random model rarely emits eos)."""
    return eos_raised(vocabularies, 25, tmp_path_factory.mktemp("eos"))


def eos_raised(vocabularies, percentile, directory):
    """`(model, source vocabulary, export in directory)`: the untied variant
    (seed 1) with its output bias for eos raised by `percentile` of the
    gaps between the best logit and eos's on the test sentences."""
    model, source, target = build(vocabularies, "untied_output", seed=1)
    config = model.config
    batch = [ids(source, s) for s in SENTENCES]
    width = max(map(len, batch)) + 1

    def pad(rows):
        return np.array([r + [config.pad_id] * (width - len(r)) for r in rows], np.int32)

    logits = keras.ops.convert_to_numpy(model(
        (pad([s + [config.eos_id] for s in batch]), pad([[config.bos_id] + s for s in batch])),
        training=False))
    gap = logits.max(-1) - logits[..., config.eos_id]
    bias = keras.ops.convert_to_numpy(model.output_projection.bias).copy()
    bias[config.eos_id] += float(np.percentile(gap, percentile))
    model.output_projection.bias.assign(bias)
    path = export_ctranslate2(model, source.model_proto, target.model_proto,
                              str(directory / "model"))
    return model, source, path


def padded(rows, pad_id):
    width = max(map(len, rows))
    return np.array([r + [pad_id] * (width - len(r)) for r in rows], np.int32)


@pytest.mark.parametrize("min_length", [0, 1, 3])
def test_greedy_search_gives_the_package_greedy_tokens(exports, eos_model, min_length):
    # Two models: one whose searches end at eos at various lengths, and a
    # random one whose searches mostly run to the limit. CTranslate2's
    # min_decoding_length masks eos before the softmax, as the package's
    # min_length does: the same tokens and scores.
    pre_ln = exports("pre_ln")
    for model, source, path in (eos_model, (pre_ln[0], pre_ln[1], pre_ln[3])):
        config = model.config
        translator = CTranslate2Translator(path)
        batch = [ids(source, s) for s in SENTENCES]
        source_ids = padded([s + [config.eos_id] for s in batch], config.pad_id)
        # One batch: the limit follows its width, the same for every sentence.
        sequences, scores = greedy_translate(model, source_ids, EXTRA_LENGTH,
                                             min_length=min_length)
        limit = min(source_ids.shape[1] + EXTRA_LENGTH, config.max_length)
        results = translator.translator.translate_batch(
            [pieces(source, s) for s in SENTENCES], beam_size=1, max_decoding_length=limit,
            min_decoding_length=min_length, return_scores=True, length_penalty=0.0)
        ended = 0
        for sequence, score, result in zip(sequences, scores, results):
            expected, has_eos = package_ids(sequence, config.eos_id, config.pad_id)
            ended += has_eos
            assert [translator._target_ids[t] for t in result.hypotheses[0]] == expected
            # The score is the log P of the tokens, eos included.
            assert result.scores[0] == pytest.approx(float(score), rel=1e-5, abs=1e-4)
        if model is eos_model[0]:
            assert 0 < ended < len(SENTENCES)
        assert all(len(package_ids(s, config.eos_id, config.pad_id)[0]) >= min_length
                   for s in sequences)


def test_beam_scores_are_log_p_over_length_to_the_alpha(eos_model):
    """CTranslate2's beam scores, checked against the Keras model: a
    finished hypothesis scores `log P / length ** alpha` (eos counted), one
    cut at the length limit `log P / length ** alpha` of its tokens."""
    model, source, path = eos_model
    config = model.config
    translator = CTranslate2Translator(path)
    for alpha in (0.0, 0.6):
        rows = []
        for sentence in SENTENCES:
            limit = decoding_limit(len(ids(source, sentence)), EXTRA_LENGTH, config.max_length)
            result = translator.translator.translate_batch(
                [pieces(source, sentence)], beam_size=4, num_hypotheses=4,
                max_decoding_length=limit, min_decoding_length=0, return_scores=True,
                length_penalty=alpha, return_end_token=True)[0]
            for tokens, score in zip(result.hypotheses, result.scores):
                ended = tokens[-1:] == ["</s>"]
                hypothesis = [translator._target_ids[t] for t in tokens[:len(tokens) - ended]]
                rows.append((ids(source, sentence), hypothesis, ended, score))
        log_probs = keras_log_probs(model, [r[0] for r in rows], [r[1] for r in rows])
        for (_, hypothesis, ended, score), log_p in zip(rows, log_probs):
            log_p = log_p if ended else log_p[:-1]
            assert score == pytest.approx(float(log_p.sum()) / len(log_p) ** alpha,
                                          rel=1e-5, abs=1e-4)


def test_beam_search_at_alpha_0_against_the_package(eos_model):
    """At alpha 0 both searches keep the same alive hypotheses; this
    package's also finishes eos candidates ranked below the beam size
    (CTranslate2 drops them) and ends a hypothesis at the limit with a forced
    eos (CTranslate2 without one). So where CTranslate2's best ends before
    the limit, the package's is the same or scores higher."""
    model, source, path = eos_model
    config = model.config
    translator = CTranslate2Translator(path)
    batch = [ids(source, s) for s in SENTENCES]
    source_ids = padded([s + [config.eos_id] for s in batch], config.pad_id)
    lengths = np.array([len(s) + 1 for s in batch], np.int32)
    sequences, scores = beam_search_translate(model, source_ids, beam_size=4, alpha=0.0,
                                              extra_length=EXTRA_LENGTH,
                                              source_length=lengths)
    texts, ct2_scores = translator.translate(SENTENCES, beam_size=4, alpha=0.0,
                                             extra_length=EXTRA_LENGTH, batch_size=4)
    same = 0
    for i, sentence in enumerate(SENTENCES):
        expected, _ = package_ids(sequences[i, 0], config.eos_id, config.pad_id)
        limit = decoding_limit(len(batch[i]), EXTRA_LENGTH, config.max_length)
        result = translator.translator.translate_batch(
            [pieces(source, sentence)], beam_size=4, max_decoding_length=limit,
            min_decoding_length=translator.min_length, return_scores=True,
            length_penalty=0.0)[0]
        got = [translator._target_ids[t] for t in result.hypotheses[0]]
        assert len(got) <= limit and len(expected) < limit
        if len(got) == limit:
            # The text engine ends a hypothesis at the limit with eos, as
            # the package does: its first limit - 1 tokens, rescored.
            assert texts[i] == source.processor.decode(got[:limit - 1])
            continue
        # The text engine batches by limit: the same search.
        assert texts[i] == source.processor.decode(got)
        assert ct2_scores[i] == pytest.approx(result.scores[0], abs=1e-5)
        if got == expected:
            assert result.scores[0] == pytest.approx(float(scores[i, 0]), rel=1e-5, abs=1e-4)
            same += 1
        elif len(got) < limit:
            assert float(scores[i, 0]) > result.scores[0]
    assert same >= 1


def alone(translator, sentence, extra_length, **options):
    """`sentence` searched by itself under its own length limit and ended
    with eos as the engine ends it: what each sentence of a batch gets."""
    source = translator.source_pieces(sentence)
    limit = decoding_limit(len(source), extra_length, translator.config.max_length)
    result = translator.translator.translate_batch(
        [source], max_decoding_length=limit, return_scores=True, max_input_length=0,
        min_decoding_length=min(translator.min_length, limit - 1), **options)[0]
    return translator._ended_with_eos(source, result, limit, options["length_penalty"])


class CountedCalls:
    """A `ctranslate2.Translator` that records the size of each
    `translate_batch` call."""

    def __init__(self, translator):
        self.translator = translator
        self.batches = []

    def translate_batch(self, batch, **options):
        self.batches.append(len(batch))
        return self.translator.translate_batch(batch, **options)

    def score_batch(self, *args, **options):
        return self.translator.score_batch(*args, **options)


@pytest.mark.parametrize("beam_size, alpha", [(4, 0.6), (3, 1.0), (4, 0.0), (1, 0.0)])
def test_each_sentence_of_a_batch_is_searched_as_alone(exports, eos_model, beam_size, alpha):
    # One model whose searches end at various lengths, one whose searches
    # mostly run to their limit: in a batch under the largest limit (the
    # fast path, alpha > 0 and greedy) or batched by limit (alpha 0), each
    # sentence gets the search of its own limit.
    pre_ln = exports("pre_ln")
    n = min(2, beam_size)
    for path in (eos_model[2], pre_ln[3]):
        translator = CTranslate2Translator(path)
        nbest = translator.translate_nbest(SENTENCES, n, beam_size, alpha, EXTRA_LENGTH)
        best = translator.translate(SENTENCES, beam_size, alpha, EXTRA_LENGTH)
        for i, sentence in enumerate(SENTENCES):
            for got, hypotheses in ((nbest[i], n), ([(best[0][i], best[1][i])], 1)):
                result = alone(translator, sentence, EXTRA_LENGTH, beam_size=beam_size,
                               length_penalty=alpha, num_hypotheses=hypotheses)
                assert [t for t, _ in got] == [translator.detokenize(h)
                                               for h in result.hypotheses]
                assert [s for _, s in got] == pytest.approx(list(result.scores), abs=1e-5)


def packages_called(function):
    """The top-level packages of the Python functions and builtins that
    `function()` calls."""
    seen = set()

    def hook(frame, event, arg):
        if event == "call":
            seen.add(str(frame.f_globals.get("__name__")).split(".")[0])
        elif event == "c_call":
            seen.add(str(getattr(arg, "__module__", None)).split(".")[0])

    sys.setprofile(hook)
    try:
        function()
    finally:
        sys.setprofile(None)
    return seen


def test_a_request_is_one_ctranslate2_call_without_tensorflow(vocabularies, tmp_path):
    """The engine's fast path, held structurally: a request of sentences of
    different lengths whose searches end well before their limits (eos
    raised past every other logit) is one `translate_batch` call, and
    tokenizing goes through SentencePiece's Python API, not TensorFlow or
    Keras."""
    translator = CTranslate2Translator(eos_raised(vocabularies, 100, tmp_path)[2])
    translator.translator = calls = CountedCalls(translator.translator)
    request = SENTENCES[:8]
    assert len({len(translator.source_pieces(s)) for s in request}) > 3
    translator.translate(request, extra_length=50)
    assert calls.batches == [8]
    for method, arguments in ((translator.translate, ()), (translator.translate_nbest, (2,))):
        calls.batches.clear()
        packages = packages_called(
            lambda m=method, a=arguments: m(request, *a, extra_length=50))
        assert calls.batches == [8]
        assert "sentencepiece" in packages
        assert not packages & {"tensorflow", "tensorflow_text", "keras", "tf_keras"}, packages


def test_int8_runs_and_stays_close(exports, tmp_path):
    model, source, target, float_path = exports("post_ln")
    int8_path = export_ctranslate2(model, source.model_proto, target.model_proto,
                                   str(tmp_path / "int8"), quantization="int8")
    assert read_ctranslate2_metadata(int8_path)["quantization"] == "int8"
    # int8 matrices: the file shrinks to about a quarter.
    assert (os.path.getsize(os.path.join(int8_path, "model.bin"))
            < 0.4 * os.path.getsize(os.path.join(float_path, "model.bin")))
    quantized = CTranslate2Translator(int8_path)
    assert quantized.compute_type == "int8_float32"
    exact = CTranslate2Translator(float_path)
    sources = [pieces(source, s) for s in SENTENCES]
    targets = sources[1:] + sources[:1]
    for q, f in zip(quantized.score(sources, targets), exact.score(sources, targets)):
        # Weights and activations rounded to 8 bits (relative error up to
        # 2^-8 per operand) move each log-probability by a small fraction of
        # the spread of a random model's log-probabilities; a wrong scale or
        # layout would move it by the whole spread.
        assert np.max(np.abs(q - f)) < 0.1 * np.std(f) + 0.05
    texts, _ = quantized.translate(SENTENCES[:3], beam_size=2)
    assert all(isinstance(t, str) for t in texts)
    # int8_float32 writes the same weights.
    same = export_ctranslate2(model, source.model_proto, target.model_proto,
                              str(tmp_path / "int8_float32"), quantization="int8_float32")
    with open(os.path.join(same, "model.bin"), "rb") as a, \
            open(os.path.join(int8_path, "model.bin"), "rb") as b:
        assert a.read() == b.read()


def test_what_ctranslate2_cannot_take_is_a_clear_error(vocabularies, tmp_path):
    model, source, target = build(vocabularies, "post_ln")
    with pytest.raises(ValueError, match="`quantization` must be one of"):
        export_ctranslate2(model, source.model_proto, target.model_proto,
                           str(tmp_path / "a"), quantization="int4")
    # Not the model's vocabulary.
    default_ids = vocabularies["default_ids"]
    with pytest.raises(ValueError, match=r"`pad_id` \(0\) differs from the source"):
        export_ctranslate2(model, default_ids, default_ids, str(tmp_path / "c"))
    small = kt.Transformer(model.config.replace(vocab_size=300))
    small.build()
    with pytest.raises(ValueError, match=r"model's source vocabulary \(`vocab_size`\) only 300"):
        export_ctranslate2(small, source.model_proto, target.model_proto, str(tmp_path / "d"))
    # Separate vocabularies that name eos differently.
    renamed = SentencePieceVocabulary(vocabularies["bpe"])
    separate, src, _ = build(vocabularies, "separate_vocabularies")
    proto = renamed.processor.serialized_model_proto()
    from sentencepiece import sentencepiece_model_pb2

    parsed = sentencepiece_model_pb2.ModelProto()
    parsed.ParseFromString(proto)
    parsed.pieces[separate.config.eos_id].piece = "<end>"
    parsed.trainer_spec.eos_piece = "<end>"
    with pytest.raises(ValueError, match="eos piece '</s>' differs from the target's '<end>'"):
        export_ctranslate2(separate, src.model_proto, parsed.SerializeToString(),
                           str(tmp_path / "e"))
    # One vocabulary in the config, two different SentencePiece models.
    parsed.ParseFromString(source.model_proto)
    parsed.pieces[10].score += 1.0
    with pytest.raises(ValueError, match="the source and target SentencePiece models differ"):
        export_ctranslate2(model, source.model_proto, parsed.SerializeToString(),
                           str(tmp_path / "f"))
    with pytest.raises(ValueError, match="must be built"):
        export_ctranslate2(kt.Transformer(model.config), source.model_proto,
                           source.model_proto, str(tmp_path / "g"))
    assert not os.listdir(tmp_path)  # nothing written


def test_without_ctranslate2_the_error_names_the_extra(monkeypatch):
    import sys

    from keras_transformer.export.ctranslate2 import import_ctranslate2

    monkeypatch.setitem(sys.modules, "ctranslate2", None)
    with pytest.raises(ImportError, match=r"attention-transformer-keras\[ctranslate2\]"):
        import_ctranslate2()


def test_an_export_replaces_an_older_one(vocabularies, tmp_path):
    model, source, target = build(vocabularies, "post_ln")
    path = str(tmp_path / "model")
    export_ctranslate2(model, source.model_proto, target.model_proto, path)
    with open(os.path.join(path, "stale"), "w") as f:
        f.write("x")
    export_ctranslate2(model, source.model_proto, target.model_proto, path,
                       quantization="int8")
    assert "stale" not in os.listdir(path)
    assert read_ctranslate2_metadata(path)["quantization"] == "int8"
    assert os.listdir(tmp_path) == ["model"]  # no temporary directories left
    with pytest.raises(FileNotFoundError, match="not a CTranslate2 export"):
        CTranslate2Translator(str(tmp_path))


# The command line ------------------------------------------------------------


@pytest.fixture(scope="module")
def run_and_export(tmp_path_factory):
    from keras_transformer.cli import export
    from test_translate_cli import make_run_directory

    tmp_path = tmp_path_factory.mktemp("ct2cli")
    keras.utils.set_random_seed(1234)
    run = make_run_directory(str(tmp_path / "de_en"))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        path = export.export(["--run-dir", run.path, "--output-dir", str(tmp_path / "out"),
                              "--format", "ctranslate2", "--beam-size", "2",
                              "--extra-length", "3"])
    source = tmp_path / "test.de"
    # A sentence, an empty and a blank line, another sentence, invalid UTF-8.
    source.write_bytes("Ein Mann fährt mit dem Fahrrad.\n\n  \nDie Mädchen.\n".encode()
                       + b"\xff\xfe\n")
    return dict(tmp_path=tmp_path, run=run, path=path, printed=printed.getvalue(),
                source=source)


def test_kt_export_writes_the_ctranslate2_directory(run_and_export):
    tmp_path, path, run = (run_and_export[k] for k in ("tmp_path", "path", "run"))
    assert path == str(tmp_path / "out" / "de_en_ct2" / "1")
    assert run_and_export["printed"] == path + "\n"
    metadata = read_ctranslate2_metadata(path)
    assert metadata["defaults"] == {"beam_size": 2, "alpha": 0.6, "extra_length": 3,
                                    "min_length": 1}
    assert metadata["config"] == run.load_config().to_dict()


def test_kt_translate_with_the_ctranslate2_engine(run_and_export):
    from keras_transformer.cli import translate
    from keras_transformer.cli.common import read_lines

    path, source = run_and_export["path"], run_and_export["source"]
    lines = read_lines(str(source))
    api = CTranslate2Translator(path)
    expected = api.translate(lines)  # the export's defaults: beam 2, extra length 3
    out = io.StringIO()
    returned = translate.translate(["--ctranslate2-model", path, "--input", str(source),
                                    "--scores"], stdout=out)
    assert returned == expected
    rows = out.getvalue().split("\n")[:-1]
    assert len(rows) == 5 and rows[1] == rows[2] == "0.0000\t"
    assert rows[0] == f"{expected[1][0]:.4f}\t{expected[0][0]}"

    out = io.StringIO()
    nbest = translate.translate(["--ctranslate2-model", path, "--input", str(source),
                                 "--n-best", "2", "--alpha", "0"], stdout=out)
    assert len(nbest) == 5 and all(len(row) == 2 for row in nbest)
    assert nbest[1] == [("", 0.0)] * 2
    assert [row[0][0] for row in nbest] == api.translate(lines, beam_size=2, alpha=0.0)[0]
    assert out.getvalue().startswith("0 ||| ")

    greedy = api.translate(lines, beam_size=1, alpha=0.0)
    sampled = translate.translate(["--ctranslate2-model", path, "--input", str(source),
                                   "--sampling", "--temperature", "0"], stdout=io.StringIO())
    assert sampled[0] == greedy[0]
    assert sampled[1] == pytest.approx(greedy[1], abs=1e-5)
    first = translate.translate(["--ctranslate2-model", path, "--input", str(source),
                                 "--sampling", "--seed", "7", "--top-k", "20"],
                                stdout=io.StringIO())
    again = translate.translate(["--ctranslate2-model", path, "--input", str(source),
                                 "--sampling", "--seed", "7", "--top-k", "20"],
                                stdout=io.StringIO())
    assert first == again

    quantized = translate.translate(["--ctranslate2-model", path, "--input", str(source),
                                     "--compute-type", "int8", "--threads", "1"],
                                    stdout=io.StringIO())
    assert len(quantized[0]) == 5 and quantized[0][1] == ""


def test_the_ctranslate2_engine_on_a_run_directory(run_and_export, capsys):
    """--engine ctranslate2 --run-dir converts the run's weights as it starts:
    kt-translate gives what the kt-export directory gives with the same
    options, and kt-evaluate scores those translations, from either source."""
    from keras_transformer.cli import evaluate, translate
    from keras_transformer.cli.common import read_lines

    run, path, source, tmp_path = (run_and_export[k]
                                   for k in ("run", "path", "source", "tmp_path"))
    lines = read_lines(str(source))
    expected = CTranslate2Translator(path).translate(lines)  # beam 2, extra length 3
    options = ["--beam-size", "2", "--extra-length", "3"]
    converted = translate.translate(["--engine", "ctranslate2", "--run-dir", run.path,
                                     "--input", str(source), *options],
                                    stdout=io.StringIO())
    assert converted[0] == expected[0]
    np.testing.assert_allclose(converted[1], expected[1], atol=1e-5)
    assert "CTranslate2 engine: converted" in capsys.readouterr().err
    # Quantized as it loads: every line still gets a translation.
    quantized = translate.translate(["--engine", "ctranslate2", "--run-dir", run.path,
                                     "--input", str(source), "--compute-type", "int8",
                                     *options], stdout=io.StringIO())
    assert len(quantized[0]) == len(lines) and quantized[0][1] == ""

    # The export's translations as references: BLEU 100 through either
    # source of the engine, and below 100 with another search.
    reference = tmp_path / "reference.txt"
    reference.write_text("".join(t + "\n" for t in expected[0]), encoding="utf-8")
    files = ["--source", str(source), "--reference", str(reference)]
    from_run = evaluate.evaluate(["--engine", "ctranslate2", "--run-dir", run.path,
                                  *files, *options], stdout=io.StringIO())
    from_export = evaluate.evaluate(["--ctranslate2-model", path, *files],
                                    stdout=io.StringIO())
    assert from_run["bleu"] == from_export["bleu"] == pytest.approx(100.0)
    other = evaluate.evaluate(["--ctranslate2-model", path, *files, "--extra-length", "0"],
                              stdout=io.StringIO())
    assert other["bleu"] < 100.0


def test_command_line_errors(run_and_export, capsys):
    from keras_transformer.cli import evaluate, export, translate

    run, path, source = (run_and_export[k] for k in ("run", "path", "source"))
    cases = [
        (export, ["--run-dir", run.path, "--quantization", "int8"],
         "--quantization applies to --format ctranslate2"),
        (export, ["--run-dir", run.path, "--format", "ctranslate2", "--quantization", "int4"],
         "invalid choice: 'int4'"),
        (translate, ["--run-dir", run.path, "--input", str(source), "--compute-type", "int8"],
         "--compute-type needs --engine ctranslate2"),
        (evaluate, ["--run-dir", run.path, "--source", str(source), "--reference",
                    str(source), "--threads", "2"], "--threads needs --engine ctranslate2"),
        (translate, ["--ctranslate2-model", path, "--run-dir", run.path],
         "not allowed with argument"),
        (translate, ["--ctranslate2-model", path, "--engine", "tensorflow"],
         "--ctranslate2-model needs --engine ctranslate2"),
        (evaluate, ["--engine", "ctranslate2", "--saved-model", path, "--source", str(source),
                    "--reference", str(source)], "not --saved-model"),
        (translate, ["--ctranslate2-model", path, "--checkpoint", "last"],
         "--checkpoint applies to --run-dir, not --ctranslate2-model"),
        (translate, ["--engine", "ctranslate2", "--run-dir", run.path, "--threads", "0"],
         "--threads must be at least 1"),
        (translate, ["--engine", "onnx", "--run-dir", run.path], "invalid choice: 'onnx'"),
    ]
    # A served version is never rewritten: the export's own version again.
    version = os.path.basename(path)
    assert export.main(["--run-dir", run.path, "--output-dir", os.path.dirname(
        os.path.dirname(path)), "--format", "ctranslate2", "--version", version]) == 2
    assert "exists: a served version is never rewritten" in capsys.readouterr().err
    for command, argv, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            command.main(argv)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
    # Not an export directory: one error line, status 2.
    assert translate.main(["--ctranslate2-model", str(run.path), "--input",
                           str(source)]) == 2
    assert "not a CTranslate2 export" in capsys.readouterr().err
