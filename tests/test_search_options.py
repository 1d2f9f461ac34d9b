"""Every engine holds the search options to the one table,
`keras_transformer.decoding.search_options.OPTIONS`: for each option, values
at and beyond its bounds are refused by the Python translator, the
SavedModel's graph checks, the CTranslate2 translator and servable, the
server's check before it measures a request's work, and kt-translate's
flags exactly when the table refuses them, and allowed otherwise."""

import doctest
import math
import os

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.cli import translate as translate_cli
from keras_transformer.decoding import search_options
from keras_transformer.decoding.search_options import MAX_EXTRA_LENGTH, OPTIONS
from keras_transformer.serving.work import WorkModel

BEAM = 3  # the n-best cases' beam

# Values each option is tried with: its edges and a step beyond each.
VALUES = {
    "beam_size": [0, 1, "half", "half+1", 2**31 - 1],
    "alpha": [-0.5, 0.0, 0.6, math.inf, math.nan],
    "extra_length": [-1, 0, 7, MAX_EXTRA_LENGTH, MAX_EXTRA_LENGTH + 1],
    "n": [0, 1, BEAM, BEAM + 1],
    "temperature": [-0.1, 0.0, 0.7, math.nan],
    "top_k": [-1, 0, 5],
    "top_p": [0.0, 1e-3, 1.0, 1.5, math.nan],
    "seed": [-2**63, 0, 2**63 - 1],
}


def cases(vocabulary):
    """`(signature, name, value)` for every value of `VALUES`, each with
    the signature that takes it."""
    out = []
    for name, values in VALUES.items():
        signature = ("translate_nbest" if name == "n" else
                     "translate_sample" if name in ("temperature", "top_k", "top_p", "seed")
                     else "translate_with_options")
        for value in values:
            if isinstance(value, str):
                value = vocabulary // 2 + (1 if value.endswith("+1") else 0)
            out.append((signature, name, value))
    return out


BASE = {"translate_with_options": {"beam_size": 2, "alpha": 0.6, "extra_length": 4},
        "translate_nbest": {"n": 1, "beam_size": BEAM, "alpha": 0.6, "extra_length": 4},
        "translate_sample": {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": 1,
                             "extra_length": 4}}


def request(signature, name, value):
    return {**BASE[signature], name: value}


@pytest.fixture
def translator():
    """Function-scoped: conftest's seeding before each test would destroy
    a module fixture's eager tf-text resources."""
    from benchmarks.tiny_serving import _tiny_translator

    return _tiny_translator(20261129)[0]


def accepts(engine, signature, options, name):
    """Whether a Python engine (`translate`, `translate_nbest`, `sample`)
    runs `signature`'s method with `options`; a refusal must name `name`."""
    method = {"translate_nbest": engine.translate_nbest,
              "translate_sample": engine.sample}.get(signature, engine.translate)
    try:
        method(["a bird sings"], **options)
        return True
    except ValueError as e:
        assert name in str(e), (name, options, e)
        return False


def allowed(options, vocabulary):
    return search_options.assertion_failure(options, {"vocabulary": vocabulary}) is None


def test_the_table_s_examples_run():
    result = doctest.testmod(search_options)
    assert result.attempted >= 4 and result.failed == 0


def test_the_table_s_edges():
    beam = OPTIONS["beam_size"]
    assert beam.allows(8, {"vocabulary": 16}) and not beam.allows(9, {"vocabulary": 16})
    assert beam.allows(2**20) and not beam.allows(2**31) and not beam.allows(2.0)
    assert not beam.allows(True) and not beam.allows("2")
    assert OPTIONS["alpha"].allows(0.0) and not OPTIONS["alpha"].allows(math.inf)
    assert OPTIONS["temperature"].allows(math.inf) and not OPTIONS["temperature"].allows(-1)
    assert not OPTIONS["top_p"].allows(0.0) and OPTIONS["top_p"].allows(1.0)
    assert OPTIONS["seed"].allows(np.int64(-2**63)) and not OPTIONS["seed"].allows(2**63)
    assert OPTIONS["n"].allows(5) and not OPTIONS["n"].allows(5, {"beam_size": 4})
    assert OPTIONS["extra_length"].rule() == f"between 0 and {MAX_EXTRA_LENGTH}"


def test_the_python_translator_and_the_graph_follow_the_table(translator):
    vocabulary = translator.config.output_vocab_size
    text = tf.constant(["a bird sings"])
    specs = {"beam_size": tf.int32, "alpha": tf.float32, "extra_length": tf.int32,
             "n": tf.int32, "temperature": tf.float32, "top_k": tf.int32,
             "top_p": tf.float32, "seed": tf.int64}
    for signature, name, value in cases(vocabulary):
        options = request(signature, name, value)
        expected = allowed(options, vocabulary)
        assert accepts(translator, signature, options, name) == expected, (
            "Translator", signature, name, value)
        # The SavedModel's graph checks (the signature functions it exports).
        tensors = {k: tf.constant(v, specs[k]) for k, v in options.items()}
        try:
            getattr(translator, "signature_" + signature)(text, **tensors)
            accepted = True
        except tf.errors.InvalidArgumentError as e:
            accepted = False
            assert f"{name} must be" in e.message, (name, value, e.message)
        assert accepted == expected, ("graph", signature, name, value)


def test_kt_translate_s_flags_follow_the_table():
    parser = translate_cli.build_parser()
    for name, values in VALUES.items():
        if name == "n":
            continue  # --n-best: a flag of its own words, tested in test_translate_cli
        for value in values:
            if isinstance(value, str):
                continue  # beam_size's bound is the model's: the engines check it
            flag = "--" + name.replace("_", "-")
            argv = ["--saved-model", "m", flag, repr(value) if isinstance(value, float)
                    else str(value)]
            if name in ("temperature", "top_k", "top_p", "seed"):
                argv.append("--sampling")
            args = parser.parse_args(argv)
            try:
                translate_cli.check_arguments(parser, args)
                accepted = True
            except SystemExit:
                accepted = False
            assert accepted == OPTIONS[name].allows(value), (flag, value)


def test_the_server_checks_before_measuring_work():
    from keras_transformer.serving.rest_api import RestError
    from keras_transformer.serving.work import RequestLimits

    class Servable:
        metadata = {"config": {"vocab_size": 60, "target_vocab_size": 40, "max_length": 12},
                    "beam_size": 2, "extra_length": 4}

    limits = RequestLimits(64, 2**31 - 1, 10**6)
    text = np.array([b"a bird sings"], object)
    for signature, name, value in cases(40):
        options = request(signature, name, value)
        inputs = {"text": text, **{k: np.array(v) for k, v in options.items()}}
        try:
            limits.check(Servable(), inputs)
            accepted = True
        except RestError as e:
            accepted = False
            assert f"{name} must be" in e.args[0], (name, value, e.args[0])
        assert accepted == allowed(options, 40), (signature, name, value)


def test_the_ctranslate2_engines_follow_the_table(tmp_path):
    pytest.importorskip("ctranslate2")
    from support.serving_model import export_tiny_ctranslate2
    from keras_transformer.serving.ctranslate2_servable import SPECS, CTranslate2Servable
    from keras_transformer.serving.model_versions import ModelError

    path = export_tiny_ctranslate2(tmp_path, name="tiny", version=1)
    servable = CTranslate2Servable(path, 1)
    engine = servable.translator
    vocabulary = engine.config.output_vocab_size
    assert WorkModel(servable.metadata).vocabulary == vocabulary
    for signature, name, value in cases(vocabulary):
        options = request(signature, name, value)
        expected = allowed(options, vocabulary)
        assert accepts(engine, signature, options, name) == expected, (
            "CTranslate2Translator", signature, name, value)
        dtypes = {k: spec.dtype for k, spec in SPECS[signature].inputs.items()}
        inputs = {"text": np.array([b"a bird sings"], object),
                  **{k: np.array(v, dtypes[k]) for k, v in options.items()}}
        try:
            servable.predict(signature, inputs)
            accepted = True
        except ModelError as e:
            accepted = False
            assert f"{name} must be" in str(e), (name, value, e)
        assert accepted == expected, ("CTranslate2Servable", signature, name, value)


def test_docs_list_every_option_as_the_table_declares_it():
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "api.md"),
              encoding="utf-8") as f:
        docs = f.read()
    for option in OPTIONS.values():
        row = (f"| `{option.name}` | {option.dtype} | {option.default} | {option.rule()} | "
               f"{option.help} |")
        assert row in docs, f"docs/api.md#search-options lacks or differs on: {row}"
