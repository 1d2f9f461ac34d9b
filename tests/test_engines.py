"""The four translation engines share one contract (`export/engine.py`): the
same methods with the same parameters and defaults; the signature names
are defined once and are the Translator's serving functions' names; the
paper's decoding defaults are defined once."""

import ast
import inspect
import os

import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.decoding import DEFAULT_ALPHA, DEFAULT_BEAM_SIZE, DEFAULT_EXTRA_LENGTH
from keras_transformer.export import engine
from keras_transformer.serving.client import RestClient
from keras_transformer.export.ctranslate2 import export_ctranslate2
from keras_transformer.export.ctranslate2_translator import CTranslate2Translator
from keras_transformer.export.engine import SIGNATURES, ExplainingEngine, TranslationEngine
from keras_transformer.export.litert_translator import LiteRTTranslator
from keras_transformer.export.saved_model import SavedModelTranslator
from keras_transformer.export.translator import Translator
from keras_transformer.tokenizer import SubwordTokenizer, train_sentencepiece
from test_tokenizer import CORPUS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINES = {Translator: ExplainingEngine, SavedModelTranslator: ExplainingEngine,
           RestClient: ExplainingEngine, CTranslate2Translator: TranslationEngine,
           LiteRTTranslator: TranslationEngine}


def contract_mismatches(engine_class, contract):
    """How `engine_class`'s methods depart from `contract`'s abstract ones:
    each must take the contract's parameters first, with the same names,
    kinds and defaults, and may take more only as options with defaults."""
    problems = []
    for name in sorted(contract.__abstractmethods__):
        wanted = list(inspect.signature(getattr(contract, name)).parameters.values())
        given = list(inspect.signature(getattr(engine_class, name)).parameters.values())
        if given[:len(wanted)] != wanted:
            problems.append(
                f"{engine_class.__name__}.{name}{inspect.signature(getattr(engine_class, name))}"
                f" is not {name}{inspect.signature(getattr(contract, name))}")
        for extra in given[len(wanted):]:
            if extra.default is inspect.Parameter.empty or extra.kind in (
                    inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                problems.append(f"{engine_class.__name__}.{name} takes {extra} beyond the "
                                "contract without a default")
    return problems


@pytest.mark.parametrize("engine_class", list(ENGINES), ids=lambda c: c.__name__)
def test_every_engine_keeps_the_contract_and_its_defaults(engine_class):
    contract = ENGINES[engine_class]
    assert issubclass(engine_class, contract)
    assert not inspect.isabstract(engine_class)
    assert contract_mismatches(engine_class, contract) == []


def test_a_diverging_default_or_parameter_is_caught():
    # The comparison itself: the REST client's former n-best defaults (the
    # paper's alpha and extra length instead of None), a renamed parameter
    # and an extra option without a default each count.
    class PaperDefaults(TranslationEngine):
        def translate(self, sentences, beam_size=None, alpha=None, extra_length=None):
            pass

        def translate_nbest(self, sentences, n, beam_size=None, alpha=0.6, extra_length=50):
            pass

        def sample(self, sentences, temperature=1.0, top_k=0, top_p=1.0, random_seed=0,
                   extra_length=None):
            pass

    class ExtraWithoutDefault(PaperDefaults):
        def translate(self, sentences, beam_size=None, alpha=None, extra_length=None, *,
                      batch_size):
            pass

    assert [p.split("(")[0] for p in contract_mismatches(PaperDefaults, TranslationEngine)] == [
        "PaperDefaults.sample", "PaperDefaults.translate_nbest"]
    assert any("batch_size" in p for p in
               contract_mismatches(ExtraWithoutDefault, TranslationEngine))


def test_the_signature_names_are_defined_once_in_order():
    assert SIGNATURES == ("serving_default", "translate_with_options", "translate_ids",
                          "translate_xla", "translate_nbest", "translate_sample",
                          "translate_explain")
    assert engine.SERVING_DEFAULT == tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
    constants = {value for name, value in vars(engine).items()
                 if name.isupper() and isinstance(value, str)}
    assert constants == set(SIGNATURES)


def test_no_signature_name_is_spelled_out_in_the_package():
    """Code names a signature by its constant: a string that is a signature
    name appears only in `export/engine.py` (docstrings and longer strings
    that mention one do not count)."""
    constants_module = os.path.join(ROOT, "keras_transformer", "export", "engine.py")
    found = []
    for directory, _, files in os.walk(os.path.join(ROOT, "keras_transformer")):
        for name in sorted(files):
            path = os.path.join(directory, name)
            if not name.endswith(".py") or path == constants_module:
                continue
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            found += [f"{os.path.relpath(path, ROOT)}:{node.lineno} {node.value!r}"
                      for node in ast.walk(tree)
                      if isinstance(node, ast.Constant) and node.value in SIGNATURES]
    assert found == []


def test_the_scan_finds_a_spelled_out_name():
    # The check above reads string constants of every form a call site uses.
    tree = ast.parse('sig["translate_xla"]\nf(name="serving_default")\nX = ("translate_ids",)')
    assert sorted(node.value for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and node.value in SIGNATURES) == [
        "serving_default", "translate_ids", "translate_xla"]


def test_the_translators_serving_functions_are_named_after_their_signatures():
    from keras_transformer.export.signatures import TranslatorModule

    assert issubclass(Translator, TranslatorModule)
    functions = {name for name, value in vars(TranslatorModule).items()
                 if isinstance(value, tf.types.experimental.PolymorphicFunction)}
    # One per signature, and the beam search those but translate_xla call.
    assert functions == {f"signature_{name}" for name in SIGNATURES} | {"_beam_search"}
    tokenizer = SubwordTokenizer(train_sentencepiece(CORPUS, vocab_size=400))
    config = kt.get_config("tiny", vocab_size=tokenizer.vocab_size, dropout=0.0, max_length=20)
    translator = Translator(kt.Transformer(config), tokenizer)
    signatures = translator.signatures()
    assert tuple(signatures) == SIGNATURES  # what export_translator saves, in order
    for name, function in signatures.items():
        assert function is getattr(translator, f"signature_{name}")
        assert function.input_signature is not None, name


def test_the_papers_decoding_defaults_are_the_exports_defaults():
    assert (DEFAULT_BEAM_SIZE, DEFAULT_ALPHA, DEFAULT_EXTRA_LENGTH) == (4, 0.6, 50)
    for function in (Translator.__init__, export_ctranslate2):
        parameters = inspect.signature(function).parameters
        assert (parameters["beam_size"].default, parameters["alpha"].default,
                parameters["extra_length"].default) == (
            DEFAULT_BEAM_SIZE, DEFAULT_ALPHA, DEFAULT_EXTRA_LENGTH), function.__qualname__
