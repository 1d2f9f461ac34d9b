"""The exported translator: same answers in a fresh process that imports only
tensorflow and tensorflow_text, only stock ops, each variable once, defined
outputs for bad input; n-best lists and samples, in-process and served; a
target vocabulary of its own."""

import base64
import json
import math
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_tokenizer import CORPUS

import keras_transformer as kt
from keras_transformer.decoding import beam_search_translate, greedy_translate
from keras_transformer.export import Translator, export_translator
from keras_transformer.export.engine import SIGNATURES
from keras_transformer.export.saved_model import read_metadata, versions
from keras_transformer.export.signatures import sanitize_utf8
from keras_transformer.tokenizer import SubwordTokenizer, train_sentencepiece

MAX_LENGTH = 20
SENTENCES = ["A man rides his bike across the bridge.", "Two dogs", "Die Mädchen."]
LONG = "The girls cross the street while it snows. " * 12
BAD = ["", "  \t\n ", LONG, b"caf\xc3 \xff\xfe ok", "Two dogs"]
# The sampling options the in-process and served samples share.
SAMPLING = dict(temperature=0.8, top_k=20, top_p=0.9, seed=5)
FRESH = """
import base64, json, sys
import tensorflow as tf
import tensorflow_text  # registers the SentencePiece ops
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.python.framework import op_def_registry

request = json.loads(sys.stdin.read())
texts = lambda key: tf.constant([base64.b64decode(t) for t in request[key]])
loaded = tf.saved_model.load(request["path"])
sig = loaded.signatures
out = {}
for key in ("sentences", "bad"):
    r = sig["serving_default"](text=texts(key))
    out[key] = {"translation": [base64.b64encode(t).decode() for t in r["translation"].numpy()],
                "score": r["score"].numpy().tolist()}
r = sig["translate_with_options"](text=texts("sentences"), beam_size=tf.constant(2),
                                  alpha=tf.constant(0.0), extra_length=tf.constant(3))
out["options"] = {"translation": [t.decode() for t in r["translation"].numpy()],
                  "score": r["score"].numpy().tolist()}
for key in ("ids", "long_ids", "truncated_ids"):
    r = sig["translate_ids"](source_ids=tf.constant(request[key], tf.int32))
    out[key] = {"ids": r["translation_ids"].numpy().tolist(), "score": r["score"].numpy().tolist()}
r = sig["serving_default"](text=tf.constant([], tf.string))
out["empty_batch"] = r["translation"].shape.as_list()
for key in ("sentences", "bad"):
    r = sig["translate_xla"](text=texts(key))
    out["xla_" + key] = {"translation": [base64.b64encode(t).decode()
                                         for t in r["translation"].numpy()],
                         "score": r["score"].numpy().tolist()}
r = sig["translate_xla"](text=tf.constant([], tf.string))
out["xla_empty_batch"] = r["translation"].shape.as_list()
r = sig["translate_nbest"](text=texts("nbest"), n=tf.constant(3), beam_size=tf.constant(3),
                           alpha=tf.constant(0.6), extra_length=tf.constant(4))
out["nbest"] = {"translations": [[base64.b64encode(t).decode() for t in row]
                                 for row in r["translations"].numpy()],
                "scores": r["scores"].numpy().tolist()}
r = sig["translate_nbest"](text=tf.constant([], tf.string), n=tf.constant(2),
                           beam_size=tf.constant(3), alpha=tf.constant(0.6),
                           extra_length=tf.constant(4))
out["nbest_empty_batch"] = r["translations"].shape.as_list()
s = request["sampling"]
r = sig["translate_sample"](text=texts("sample"), temperature=tf.constant(s["temperature"]),
                            top_k=tf.constant(s["top_k"]), top_p=tf.constant(s["top_p"]),
                            seed=tf.constant(s["seed"], tf.int64), extra_length=tf.constant(4))
out["sample"] = {"translation": [base64.b64encode(t).decode() for t in r["translation"].numpy()],
                 "score": r["score"].numpy().tolist()}
# The explainable signature with the export's defaults, beside serving_default.
r = sig["translate_explain"](text=texts("explain"), beam_size=tf.constant(3),
                             alpha=tf.constant(0.6), extra_length=tf.constant(4))
out["explain"] = {key: value.numpy().tolist() for key, value in r.items()
                  if key not in ("translation", "source_pieces", "target_pieces")}
for key in ("translation", "source_pieces", "target_pieces"):
    out["explain"][key] = [base64.b64encode(t).decode() for t in
                           r[key].numpy().reshape(-1)]
out["explain"]["pieces_shape"] = [r["source_pieces"].shape.as_list(),
                                  r["target_pieces"].shape.as_list()]
r = sig["serving_default"](text=texts("explain"))
out["explain_default"] = {"translation": [base64.b64encode(t).decode()
                                          for t in r["translation"].numpy()],
                          "score": r["score"].numpy().tolist()}
r = sig["translate_explain"](text=tf.constant([], tf.string), beam_size=tf.constant(3),
                             alpha=tf.constant(0.6), extra_length=tf.constant(4))
out["explain_empty_batch"] = r["alignment"].shape.as_list()
out["bad_options"] = {}
for name, signature, options in [
        ("n", "translate_nbest", dict(n=tf.constant(4), beam_size=tf.constant(3),
                                      alpha=tf.constant(0.6), extra_length=tf.constant(4))),
        ("top_p", "translate_sample", dict(
            temperature=tf.constant(1.0), top_k=tf.constant(0), top_p=tf.constant(0.0),
            seed=tf.constant(0, tf.int64), extra_length=tf.constant(4))),
        ("temperature", "translate_sample", dict(
            temperature=tf.constant(-1.0), top_k=tf.constant(0), top_p=tf.constant(1.0),
            seed=tf.constant(0, tf.int64), extra_length=tf.constant(4)))]:
    try:
        sig[signature](text=texts("sentences"), **options)
        out["bad_options"][name] = None
    except tf.errors.InvalidArgumentError as e:
        out["bad_options"][name] = e.message
try:
    sig["translate_with_options"](text=texts("sentences"), beam_size=tf.constant(0),
                                  alpha=tf.constant(0.6), extra_length=tf.constant(5))
    out["bad_beam"] = None
except tf.errors.InvalidArgumentError as e:
    out["bad_beam"] = e.message
proto = saved_model_pb2.SavedModel()
with open(request["path"] + "/saved_model.pb", "rb") as f:
    proto.ParseFromString(f.read())
out["signatures"] = sorted(proto.meta_graphs[0].signature_def)
ops = set()
for graph in proto.meta_graphs:
    ops |= {node.op for node in graph.graph_def.node}
    for function in graph.graph_def.library.function:
        ops |= {node.op for node in function.node_def}
out["ops"] = sorted(ops)
# Which signatures reach a function XLA must compile (TF Serving runs those
# only with --xla_cpu_compilation_enabled=true).
graph = proto.meta_graphs[0]
library = {f.signature.name: f for f in graph.graph_def.library.function}
must_compile = {name for name, f in library.items()
                if "_XlaMustCompile" in f.attr and f.attr["_XlaMustCompile"].b}
def callees(node):
    for attr in node.attr.values():
        if attr.HasField("func"):
            yield attr.func.name
        yield from (f.name for f in attr.list.func)
nodes = {node.name: node for node in graph.graph_def.node}
# The beam search every beam signature but translate_xla calls, held once.
searches = {name for name in library if name.startswith("__inference__beam_search_")}
out["beam_search_functions"] = len(searches)
out["while_loops"] = sum(name.startswith("while_body") for name in library)
out["reaches_xla"], out["reaches_search"] = {}, {}
for name, signature in graph.signature_def.items():
    stack, seen = [], set()
    for tensor in signature.outputs.values():
        stack.extend(callees(nodes[tensor.name.split(":")[0]]))
    while stack:
        function = stack.pop()
        if function in seen or function not in library:
            continue
        seen.add(function)
        for node in library[function].node_def:
            stack.extend(callees(node))
    out["reaches_xla"][name] = bool(seen & must_compile)
    out["reaches_search"][name] = bool(seen & searches)
# Inference traces no custom gradient, so no gradient function is saved
# (nothing differentiates through a served model; tracing them is export time).
out["gradient_functions"] = sorted(name for name in library if "grad_fn" in name)
# Ops under a custom gradient (their `_gradient_op_type` names a gradient the
# SavedModel would need; loading warns about each function holding one).
out["custom_gradient_ops"] = sorted(
    node.name for f in library.values() for node in f.node_def if "_gradient_op_type" in node.attr)
out["unregistered"] = sorted(op for op in ops if op_def_registry.get(op) is None)
out["our_modules"] = sorted(m for m in sys.modules if m.startswith("keras_transformer"))
print(json.dumps(out))
"""


def as_bytes(text):
    return text.encode("utf-8") if isinstance(text, str) else text


def b64(texts):
    return [base64.b64encode(as_bytes(t)).decode() for t in texts]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Builds, uses in-process and exports one tiny translator. Everything
    in-process is computed here: the per-test seeding destroys the
    tokenizer's eager resource."""
    # Module fixtures are set up before the per-test seeding: seed here, so
    # the weights do not depend on which tests ran first (and before the
    # tokenizer exists: seeding destroys eager tf-text resources).
    keras.utils.set_random_seed(20261122)
    # Separate vocabularies: the target's (BPE, 420 pieces) differs from the
    # source's (unigram, 332 pieces), and its ids past 331 exist only there.
    tokenizer = SubwordTokenizer(train_sentencepiece(CORPUS, vocab_size=400))
    target = SubwordTokenizer(train_sentencepiece(CORPUS, vocab_size=420, model_type="bpe"))
    # One layer: the signatures' plumbing does not depend on depth, and a
    # shallower model traces and exports sooner.
    config = kt.get_config("tiny", vocab_size=tokenizer.vocab_size,
                           target_vocab_size=target.vocab_size, dropout=0.0,
                           max_length=MAX_LENGTH, num_layers=1)
    model = kt.Transformer(config)
    model.build()
    translator = Translator(model, tokenizer, beam_size=3, alpha=0.6, extra_length=4,
                            target_tokenizer=target)
    long_tokens = tokenizer.tokenize(tf.constant([LONG])).to_list()[0]
    ids = tokenizer.tokenize(tf.constant(SENTENCES)).to_tensor().numpy()
    # The n-best lists of the Python API's beam search, detokenized, on the
    # sources as the input rules make them (truncated, eos appended).
    rows = [t[:MAX_LENGTH - 1] + [config.eos_id]
            for t in tokenizer.tokenize(tf.constant(SENTENCES)).to_list()]
    source_ids = np.full((len(rows), max(map(len, rows))), config.pad_id, "int32")
    for i, row in enumerate(rows):
        source_ids[i, :len(row)] = row
    sequences, scores = beam_search_translate(model, source_ids, 3, 0.6, 4,
                                              source_length=np.array([len(r) for r in rows]))
    reference_nbest = [
        list(zip([t.decode("utf-8") for t in sanitize_utf8(target.detokenize(
            np.asarray(sequences[b]))).numpy()], np.asarray(scores[b]).tolist()))
        for b in range(len(rows))]
    served_ids = translator.signature_translate_ids(tf.constant(ids))
    result = {
        "sentences": translator.translate(SENTENCES),
        "bad": translator.translate(BAD),
        "options": translator.translate(SENTENCES, beam_size=2, alpha=0.0, extra_length=3),
        "ids": translator.signature_translate_ids(tf.constant(ids)),
        "replaced": translator.translate(["caf\ufffd \ufffd\ufffd ok"]),
        # The in-process XLA path (static, bucketed shapes; filler rows).
        "xla": translator.translate(SENTENCES + BAD, batch_size=3, jit_compile=True),
        "xla_options": translator.translate(SENTENCES, beam_size=2, alpha=0.0,
                                            extra_length=3, jit_compile=True),
        "all": translator.translate(SENTENCES + BAD, batch_size=3),
        "alone": translator.translate(["Two dogs"]),
        "beside_long": translator.translate([LONG, "Two dogs"]),
        "num_weights": len({id(w.value) for w in model.weights}),
        "weight_shapes": sorted(tuple(w.shape) for w in model.weights),
        "long_tokens": long_tokens,
        "ids_input": ids.tolist(),
        # Output ids detokenized by each vocabulary.
        "by_target": [t.decode("utf-8") for t in sanitize_utf8(
            target.detokenize(served_ids["translation_ids"])).numpy()],
        "by_source": [t.decode("utf-8", "replace") for t in tokenizer.detokenize(
            tf.minimum(served_ids["translation_ids"], tokenizer.vocab_size - 1)).numpy()],
        "nbest": translator.translate_nbest(SENTENCES + BAD, 3),
        "nbest_reference": reference_nbest,
        "beam_3": translator.translate(SENTENCES + BAD, beam_size=3),
        "nbest_wider": translator.translate_nbest(SENTENCES, 2, beam_size=4, alpha=0.0,
                                                  extra_length=3),
        "beam_4": translator.translate(SENTENCES, beam_size=4, alpha=0.0, extra_length=3),
        "sample": translator.sample(SENTENCES + BAD, **SAMPLING),
        "sample_again": translator.sample(SENTENCES + BAD, **SAMPLING),
        "sample_in_ones": translator.sample(SENTENCES + BAD, batch_size=1, **SAMPLING),
        "sample_other_seed": translator.sample(SENTENCES + BAD, **dict(SAMPLING, seed=6)),
        "sample_greedy": translator.sample(SENTENCES, temperature=0.0),
        # Greedy search one sentence at a time: its limit is the sentence's
        # own, as the translator's per-sentence limits make it.
        "greedy": [
            (sanitize_utf8(target.detokenize(np.asarray(ids))).numpy()[0].decode("utf-8"),
             float(np.asarray(score)[0]))
            for ids, score in (greedy_translate(model, np.array([row], "int32"), 4)
                               for row in rows)],
        "explain": translator.explain(SENTENCES + BAD),
        "explain_beam_1": translator.explain(SENTENCES, beam_size=1, alpha=0.0),
        "greedy_options": translator.translate(SENTENCES, beam_size=1, alpha=0.0),
    }
    serving = [getattr(translator, f"signature_{name}") for name in SIGNATURES]
    traced = [f.experimental_get_tracing_count() for f in serving]
    result["path"] = export_translator(
        translator, str(tmp_path_factory.mktemp("saved_models")), name="tiny"
    )
    result["traces_at_export"] = [
        f.experimental_get_tracing_count() - n for f, n in zip(serving, traced)]
    return result


@pytest.fixture(scope="module")
def fresh(exported):
    long = exported["long_tokens"]
    request = {
        "path": exported["path"], "sentences": b64(SENTENCES), "bad": b64(BAD),
        "ids": exported["ids_input"], "long_ids": [long],
        "truncated_ids": [long[: MAX_LENGTH - 1]],
        "nbest": b64(SENTENCES + BAD), "sample": b64(SENTENCES + BAD), "sampling": SAMPLING,
        "explain": b64(SENTENCES + BAD),
    }
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "-c", FRESH], input=json.dumps(request),
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]), stderr=done.stderr)


def decoded(out):
    return [base64.b64decode(t).decode("utf-8") for t in out["translation"]]


def test_a_fresh_process_gets_the_in_process_translations(exported, fresh):
    assert fresh["our_modules"] == []
    translations, scores = exported["sentences"]
    assert decoded(fresh["sentences"]) == translations
    np.testing.assert_allclose(fresh["sentences"]["score"], scores, rtol=1e-5, atol=1e-5)
    translations, scores = exported["options"]
    assert fresh["options"]["translation"] == translations
    np.testing.assert_allclose(fresh["options"]["score"], scores, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(fresh["ids"]["ids"], exported["ids"]["translation_ids"])
    np.testing.assert_allclose(fresh["ids"]["score"], exported["ids"]["score"], rtol=1e-5)
    assert all(t for t in translations)  # something was decoded


def test_bad_inputs_in_one_batch_through_the_saved_model(exported, fresh):
    translations = decoded(fresh["bad"])  # strict UTF-8 decoding: always valid
    scores = fresh["bad"]["score"]
    assert all(math.isfinite(s) and s <= 0 for s in scores)
    assert translations[:2] == ["", ""] and scores[:2] == [0.0, 0.0]  # empty, whitespace
    assert translations[2] and scores[2] < 0  # truncated, still translated
    assert translations[3] == exported["replaced"][0][0]  # invalid bytes -> U+FFFD
    assert translations[4] == decoded(fresh["sentences"])[1]  # "Two dogs", batch-independent
    assert translations == exported["bad"][0]
    assert fresh["empty_batch"] == [0]
    assert "beam_size must be between 1 and" in fresh["bad_beam"]


def test_xla_translation_matches_the_graph_translation(exported):
    translations, scores = exported["xla"]
    assert translations == exported["all"][0]
    np.testing.assert_allclose(scores, exported["all"][1], rtol=1e-4, atol=1e-4)
    translations, scores = exported["xla_options"]
    assert translations == exported["options"][0]
    np.testing.assert_allclose(scores, exported["options"][1], rtol=1e-4, atol=1e-4)


def test_test_set_translation_compiles_one_search_per_16_token_source_bucket():
    # Translating a test set compiles the search once per source-length
    # bucket, and compiling is most of the time there: buckets of 16 tokens
    # (TEST_SET_LENGTH_BUCKET), where a server's signature uses 8.
    from keras_transformer.export.signatures import (
        SOURCE_LENGTH_BUCKET,
        TEST_SET_LENGTH_BUCKET,
    )

    assert (SOURCE_LENGTH_BUCKET, TEST_SET_LENGTH_BUCKET) == (8, 16)
    keras.utils.set_random_seed(20261123)
    tokenizer = SubwordTokenizer(train_sentencepiece(CORPUS, vocab_size=400))
    config = kt.get_config("tiny", vocab_size=tokenizer.vocab_size, dropout=0.0,
                           max_length=40, num_layers=1)
    model = kt.Transformer(config)
    model.build()
    translator = Translator(model, tokenizer, beam_size=2, alpha=0.6, extra_length=2)
    # Sources of 1-8, 9-16 and 17-32 tokens, eos included.
    candidates = [" ".join(["Two dogs"] * k) for k in range(1, 16)]
    lengths = [len(t) + 1 for t in tokenizer.tokenize(tf.constant(candidates)).to_list()]
    short, longer, longest = (
        next(c for c, n in zip(candidates, lengths) if low < n <= high)
        for low, high in [(0, 8), (8, 16), (16, 32)])
    search = translator._xla_search(2, 0.6, 2)
    translator.translate([short, longer], batch_size=1, jit_compile=True)
    assert search.experimental_get_tracing_count() == 1
    translator.translate([longest], batch_size=1, jit_compile=True)
    assert search.experimental_get_tracing_count() == 2


def test_the_xla_signature_gives_the_serving_default_translations(exported, fresh):
    for key in ("sentences", "bad"):
        assert decoded(fresh["xla_" + key]) == decoded(fresh[key])
        np.testing.assert_allclose(fresh["xla_" + key]["score"], fresh[key]["score"],
                                   rtol=1e-4, atol=1e-4)
    assert fresh["xla_empty_batch"] == [0]
    # Only translate_xla needs an XLA-enabled server.
    assert fresh["reaches_xla"] == {"serving_default": False,
                                    "translate_with_options": False,
                                    "translate_ids": False, "translate_xla": True,
                                    "translate_nbest": False, "translate_sample": False,
                                    "translate_explain": False,
                                    "__saved_model_init_op": False}


def test_a_translation_does_not_depend_on_its_batch(exported):
    # Output limits are per sentence (source tokens + extra), not the
    # batch's longest: alone or beside a long sentence, the same result.
    alone = exported["alone"]
    assert exported["beside_long"][0][1] == alone[0][0]
    np.testing.assert_allclose(exported["beside_long"][1][1], alone[1][0], rtol=1e-5)


def test_long_sources_are_truncated_as_documented(exported, fresh):
    assert len(exported["long_tokens"]) > MAX_LENGTH
    assert fresh["long_ids"] == fresh["truncated_ids"]


def test_every_op_is_registered_by_tensorflow_or_tensorflow_text(fresh):
    # The ops of every function in the SavedModel, the n-best and sampling
    # signatures' included: their stateless uniforms and per-sentence
    # hashes are in the list.
    assert {"translate_nbest", "translate_sample", "translate_explain"} <= set(
        fresh["signatures"])
    assert fresh["unregistered"] == []
    assert {"SentencepieceOp", "SentencepieceTokenizeOp", "SentencepieceDetokenizeOp",
            "SentencepieceIdToStringOp",
            "While", "TopKV2", "StatelessRandomUniformV2", "StringToHashBucketFast",
            "Cumsum"} <= set(fresh["ops"])
    forbidden = [op for op in fresh["ops"]
                 if op.startswith("Xla") or op in ("PyFunc", "EagerPyFunc", "PyFuncStateless")]
    assert forbidden == []


def test_the_saved_model_has_the_named_signatures(fresh):
    # The names code uses (`export/engine.py`) are the names TF Serving sees
    # (beside TensorFlow's own `__saved_model_init_op`).
    assert [name for name in fresh["signatures"] if not name.startswith("__")] == sorted(
        SIGNATURES)


def test_the_beam_signatures_share_one_search(fresh):
    # One traced beam search, called by every beam signature but
    # translate_xla (compiled on static shapes); with translate_xla's and
    # translate_sample's, three while loops in the SavedModel, not seven.
    assert fresh["beam_search_functions"] == 1
    assert {name for name, reaches in fresh["reaches_search"].items() if reaches} == {
        "serving_default", "translate_with_options", "translate_ids", "translate_nbest",
        "translate_explain"}
    assert fresh["while_loops"] == 3


def test_export_traces_each_serving_function_once(exported):
    # Once, in the SavedModel's own tracing context: a concrete function traced
    # before `tf.saved_model.save` would be traced there a second time.
    assert exported["traces_at_export"] == [1, 1, 1, 1, 1, 1, 1]


def test_the_saved_model_carries_no_gradient_functions(fresh):
    assert fresh["gradient_functions"] == []


def test_the_saved_model_has_no_custom_gradients_and_loads_without_warnings(fresh):
    # Inference traces no custom gradient (layers/layer_norm.py), so there is
    # nothing whose gradient the SavedModel lacks, and `tf.saved_model.load`
    # does not warn "Importing a function ... with ops with unsaved custom
    # gradients" for every serving function.
    assert fresh["custom_gradient_ops"] == []
    assert "custom gradients" not in fresh["stderr"]


def test_each_variable_is_stored_once(exported):
    stored = [(name, shape) for name, shape in
              tf.train.list_variables(os.path.join(exported["path"], "variables", "variables"))
              if name.endswith("VARIABLE_VALUE")]
    assert len(stored) == exported["num_weights"]
    assert sorted(tuple(shape) for _, shape in stored) == exported["weight_shapes"]


def test_saved_model_cli_lists_the_signatures(exported):
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    done = subprocess.run([cli, "show", "--dir", exported["path"], "--all"],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert done.returncode == 0, done.stderr[-2000:]
    for name in ("serving_default", "translate_with_options", "translate_ids", "translate_xla",
                 "translate_nbest", "translate_sample", "inputs['text']", "inputs['n']",
                 "inputs['seed']", "outputs['translation']", "outputs['score']",
                 "outputs['translations']", "outputs['scores']"):
        assert name in done.stdout


def test_metadata_records_the_decoding_defaults(exported):
    metadata = read_metadata(exported["path"])
    assert (metadata["beam_size"], metadata["alpha"], metadata["extra_length"]) == (3, 0.6, 4)
    assert metadata["max_source_tokens"] == MAX_LENGTH - 1
    assert metadata["config"]["max_length"] == MAX_LENGTH
    assert (metadata["shared_vocabulary"], metadata["source_vocab_size"],
            metadata["target_vocab_size"]) == (False, 332, 420)
    assert {"translate_nbest", "translate_sample"} <= set(metadata["signatures"])


def test_the_output_is_detokenized_with_the_target_vocabulary(exported, fresh):
    # Output ids are target ids: the translations are the target
    # vocabulary's pieces, not the source's (which read the same ids as
    # other text), in-process and served (loaded, the two SentencePiece
    # resources stay apart: tokenizing with the target's or detokenizing
    # with the source's would give other text).
    translations = exported["sentences"][0]
    assert translations == exported["by_target"]
    assert translations != exported["by_source"]
    assert decoded(fresh["sentences"]) == translations


def test_n_best_lists_are_the_beam_searchs_best_first(exported):
    nbest, (translations, scores) = exported["nbest"], exported["beam_3"]
    assert len(nbest) == len(SENTENCES + BAD) and all(len(row) == 3 for row in nbest)
    for row, reference in zip(nbest, exported["nbest_reference"]):  # the Python API's
        assert [t for t, _ in row] == [t for t, _ in reference]
        np.testing.assert_allclose([s for _, s in row], [s for _, s in reference],
                                   rtol=1e-5, atol=1e-5)
    for row, translation, score in zip(nbest, translations, scores):
        assert row[0][0] == translation  # the first is translate's
        assert row[0][1] == pytest.approx(score, abs=1e-5)
        assert [s for _, s in row] == sorted((s for _, s in row), reverse=True)
    assert nbest[0][0] != nbest[0][1]  # distinct hypotheses, not one repeated
    assert nbest[3] == [("", 0.0)] * 3 and nbest[4] == [("", 0.0)] * 3  # empty, blank
    for row, translation in zip(exported["nbest_wider"], exported["beam_4"][0]):
        assert len(row) == 2 and row[0][0] == translation


def test_the_served_n_best_lists_are_the_in_process_ones(exported, fresh):
    served = [[base64.b64decode(t).decode("utf-8") for t in row]
              for row in fresh["nbest"]["translations"]]
    assert served == [[t for t, _ in row] for row in exported["nbest"]]
    np.testing.assert_allclose(fresh["nbest"]["scores"],
                               [[s for _, s in row] for row in exported["nbest"]],
                               rtol=1e-5, atol=1e-5)
    assert fresh["nbest_empty_batch"] == [0, 2]
    assert "n must be between 1 and beam_size" in fresh["bad_options"]["n"]


def test_samples_are_reproducible_per_seed_and_sentence(exported, fresh):
    translations, scores = exported["sample"]
    assert exported["sample_again"] == (translations, scores)
    # Batch-independent: one sentence a batch gives the same samples.
    assert exported["sample_in_ones"][0] == translations
    np.testing.assert_allclose(exported["sample_in_ones"][1], scores, rtol=1e-5, atol=1e-5)
    assert exported["sample_other_seed"][0] != translations
    assert translations[3:5] == ["", ""] and scores[3:5] == [0.0, 0.0]  # empty, blank
    assert translations[1] == translations[7]  # "Two dogs" twice, one seed: one sample
    assert all(math.isfinite(s) and s <= 0 for s in scores)
    # Served: the same samples for the same request.
    assert decoded(fresh["sample"]) == translations
    np.testing.assert_allclose(fresh["sample"]["score"], scores, rtol=1e-5, atol=1e-5)
    assert "top_p must be in (0, 1]" in fresh["bad_options"]["top_p"]
    assert "temperature must be >= 0" in fresh["bad_options"]["temperature"]


def test_temperature_zero_samples_the_greedy_translation(exported):
    # The Python API's greedy search, whose score is log P, as a sample's.
    assert exported["sample_greedy"][0] == [t for t, _ in exported["greedy"]]
    np.testing.assert_allclose(exported["sample_greedy"][1], [s for _, s in exported["greedy"]],
                               rtol=1e-5, atol=1e-5)


def test_the_explainable_signature_translates_as_serving_default(exported, fresh):
    # Exported with beam 3, alpha 0.6, extra 4: the explain call with those
    # options runs serving_default's search in the same process.
    served = fresh["explain"]
    assert served["translation"] == fresh["explain_default"]["translation"]
    np.testing.assert_allclose(served["score"], fresh["explain_default"]["score"],
                               rtol=1e-6, atol=1e-6)
    translations, scores = exported["all"]
    assert [e["translation"] for e in exported["explain"]] == translations
    np.testing.assert_allclose([e["score"] for e in exported["explain"]], scores,
                               rtol=1e-5, atol=1e-5)
    assert fresh["explain_empty_batch"][0] == 0
    # The options reach the search: beam 1, alpha 0 as translate's.
    assert [e["translation"] for e in exported["explain_beam_1"]] == \
        exported["greedy_options"][0]


def test_an_explanation_accounts_for_its_translation(exported, fresh):
    alpha, limit_extra = 0.6, 4
    for sentence, e in zip(SENTENCES + BAD, exported["explain"]):
        t, s = len(e["target_pieces"]), len(e["source_pieces"])
        if not e["translation"]:
            assert e["target_pieces"] == [] and e["alignment"] == [] and e["score"] == 0.0
            continue
        assert e["source_pieces"][-1] == "</s>" and "</s>" not in e["source_pieces"][:-1]
        assert s <= MAX_LENGTH
        # Ended by eos, forced there when the hypothesis reached the
        # sentence's length limit.
        assert e["target_pieces"][-1] == "</s>" and "</s>" not in e["target_pieces"][:-1]
        assert t <= min(s + limit_extra, MAX_LENGTH)
        # Detokenized, the pieces are the translation.
        text = "".join(p for p in e["target_pieces"] if p != "</s>").replace("\u2581", " ")
        assert len(text.strip()) > 0
        # The score is the beam search's: the pieces' log-probabilities
        # summed, under the length penalty (incremental vs teacher-forced
        # decoding: float32 rounding apart).
        assert all(lp <= 0.0 for lp in e["token_log_probs"])
        penalty = ((5.0 + t) / 6.0) ** alpha
        assert sum(e["token_log_probs"]) / penalty == pytest.approx(e["score"], rel=1e-4,
                                                                    abs=1e-4)
        alignment = np.array(e["alignment"])
        assert alignment.shape == (t, s)
        np.testing.assert_allclose(alignment.sum(axis=1), 1.0, atol=1e-5)
        assert (alignment >= 0).all()
    # Served: the same explanation, padded to the batch's widest.
    served = fresh["explain"]
    rows, width = served["pieces_shape"][1]
    assert served["target_length"] == [len(e["target_pieces"]) for e in exported["explain"]]
    assert served["source_length"] == [len(e["source_pieces"]) for e in exported["explain"]]
    target_pieces = [base64.b64decode(p).decode() for p in served["target_pieces"]]
    for b, e in enumerate(exported["explain"]):
        t = len(e["target_pieces"])
        assert target_pieces[b * width: b * width + t] == e["target_pieces"]
        assert set(target_pieces[b * width + t: (b + 1) * width]) <= {""}
        np.testing.assert_allclose(served["token_log_probs"][b][:t], e["token_log_probs"],
                                   rtol=1e-5, atol=1e-5)
        assert served["token_log_probs"][b][t:] == [0.0] * (width - t)


class _Tiny(tf.Module):
    """The smallest thing `export_translator` can write."""

    def __init__(self, fail=False):
        super().__init__()
        self.v = tf.Variable(1.0)
        self.fail = fail

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def serve(self, text):
        return {"translation": text, "score": tf.zeros_like(text, tf.float32) + self.v}

    def signatures(self):
        if self.fail:
            raise RuntimeError("export interrupted")
        return {"serving_default": self.serve.get_concrete_function()}

    def metadata(self):
        return {"beam_size": 1, "alpha": 0.6, "extra_length": 5}


def test_an_export_without_the_xla_signature_is_a_clear_error_with_xla(tmp_path):
    from keras_transformer.export.saved_model import SavedModelTranslator

    translator = SavedModelTranslator(export_translator(_Tiny(), str(tmp_path), name="m"))
    assert translator.translate(["a"]) == (["a"], [1.0])
    with pytest.raises(ValueError, match="no translate_xla signature.*--no-xla"):
        translator.translate(["a"], jit_compile=True)


def test_versions_are_next_integers_written_atomically(tmp_path):
    first = export_translator(_Tiny(), str(tmp_path), name="m")
    second = export_translator(_Tiny(), str(tmp_path), name="m")
    assert [os.path.basename(first), os.path.basename(second)] == ["1", "2"]
    with pytest.raises(RuntimeError, match="interrupted"):
        export_translator(_Tiny(fail=True), str(tmp_path), name="m")
    assert versions(str(tmp_path / "m")) == [1, 2]
    assert sorted(os.listdir(tmp_path)) == ["m"]  # no temporary directory left
    assert sorted(os.listdir(tmp_path / "m")) == ["1", "2"]
    with pytest.raises(FileExistsError):
        export_translator(_Tiny(), str(tmp_path), name="m", version=2)
    with pytest.raises(ValueError, match="name"):
        export_translator(_Tiny(), str(tmp_path), name="../escape")


def test_rejects_a_tokenizer_that_is_not_the_models():
    tokenizer = SubwordTokenizer(train_sentencepiece(CORPUS, vocab_size=400))
    config = kt.get_config("tiny", vocab_size=tokenizer.vocab_size, eos_id=5)
    model = kt.Transformer(config)
    with pytest.raises(ValueError, match="eos_id"):
        Translator(model, tokenizer)
    # Source against `vocab_size`, target against `output_vocab_size`.
    target = SubwordTokenizer(train_sentencepiece(CORPUS, vocab_size=420, model_type="bpe"))
    separate = kt.get_config("tiny", vocab_size=tokenizer.vocab_size,
                             target_vocab_size=target.vocab_size)
    Translator(kt.Transformer(separate), tokenizer, target_tokenizer=target)
    with pytest.raises(ValueError, match="target tokenizer has 420 pieces"):
        Translator(kt.Transformer(separate.replace(target_vocab_size=400)), tokenizer,
                   target_tokenizer=target)
    with pytest.raises(ValueError, match="source tokenizer has 420 pieces"):
        Translator(kt.Transformer(separate), target, target_tokenizer=target)
