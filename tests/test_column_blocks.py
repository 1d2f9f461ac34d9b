"""The decoder's products in column blocks (`export/column_blocks.py` makes
the copies, `dispatch.using_column_blocks` and `kernels/column_blocks.py`
take them; `Translator(xla_column_blocks=n)`, `kt-export
--xla-column-blocks`): the same products to float32 rounding, taken only in
the XLA search, saved in the SavedModel, and bad values refused."""

import json
import os
import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer import dispatch
from keras_transformer.export import Translator, column_blocks, export_translator
from keras_transformer.export.saved_model import read_metadata
from keras_transformer.layers.dense import Dense
from keras_transformer.layers.embedding import TokenEmbedding
from keras_transformer.tokenizer import SubwordTokenizer, train_sentencepiece
from test_tokenizer import CORPUS

EPS = float(np.finfo(np.float32).eps)
SENTENCES = ["A man rides his bike across the bridge.", "Two dogs", "Die Mädchen.",
             "The girls cross the street while it snows."]


def product_bound(x, w):
    """Float32 rounding bound of `x @ w` summed in any order: `d_in` roundings
    of partial sums no larger than `|x| @ |w|`, plus the bias add."""
    return 2 * (x.shape[1] + 2) * EPS * (np.abs(x) @ np.abs(w)) + 1e-30


def test_block_sizes_cover_the_columns_and_refuse_bad_counts():
    assert column_blocks.block_sizes(10, 3) == [4, 3, 3]
    assert column_blocks.block_sizes(8, 1) == [8]
    parts = column_blocks.split(np.arange(20).reshape(2, 10), 3, axis=1)
    np.testing.assert_array_equal(np.concatenate(parts, axis=1), np.arange(20).reshape(2, 10))
    assert all(p.flags["C_CONTIGUOUS"] for p in parts)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="`blocks` must be an int >= 1"):
            column_blocks.block_sizes(10, bad)
    with pytest.raises(ValueError, match="Cannot cut 3 columns into 4 blocks"):
        column_blocks.block_sizes(3, 4)


@pytest.mark.numerics
@pytest.mark.parametrize("blocks", [2, 3])
@pytest.mark.parametrize("activation,use_bias", [("relu", True), (None, True), (None, False)])
def test_dense_in_blocks_is_the_same_product(blocks, activation, use_bias):
    rng = np.random.default_rng(blocks)
    layer = Dense(10, activation=activation, use_bias=use_bias)
    layer.build((None, 16))
    if use_bias:
        layer.bias.assign(rng.standard_normal(10).astype("float32"))
    x = rng.standard_normal((4, 16)).astype("float32")
    kernels = column_blocks.split(layer.kernel.numpy(), blocks, axis=1)
    biases = (column_blocks.split(layer.bias.numpy(), blocks, axis=0) if use_bias
              else [None] * blocks)
    whole = layer(x).numpy()
    with dispatch.using_column_blocks({id(layer): list(zip(kernels, biases))}):
        blocked = layer(x).numpy()
        trained = layer(x, training=True).numpy()
    bound = product_bound(x, layer.kernel.numpy())
    assert np.all(np.abs(blocked - whole) <= bound)
    np.testing.assert_array_equal(trained, whole)  # training never takes the blocks


def test_the_blocks_are_what_is_multiplied_outside_training_only():
    layer = Dense(6)
    layer.build((None, 5))
    x = np.ones((3, 5), "float32")
    zeros = [(np.zeros((5, 3), "float32"), np.zeros(3, "float32"))] * 2
    with dispatch.using_column_blocks({id(layer): zeros}):
        np.testing.assert_array_equal(layer(x).numpy(), np.zeros((3, 6)))
        assert np.abs(layer(x, training=True).numpy()).max() > 0
    assert np.abs(layer(x).numpy()).max() > 0  # the scope has ended


def test_a_scope_reaches_its_own_thread_only():
    # A server may trace searches in several threads at once.
    layer = Dense(6)
    layer.build((None, 5))
    x = np.ones((3, 5), "float32")
    zeros = [(np.zeros((5, 3), "float32"), np.zeros(3, "float32"))] * 2
    other = {}
    with dispatch.using_column_blocks({id(layer): zeros}):
        thread = threading.Thread(target=lambda: other.update(out=layer(x).numpy()))
        thread.start()
        thread.join()
        here = layer(x).numpy()
    assert np.abs(here).max() == 0
    assert np.abs(other["out"]).max() > 0


@pytest.mark.numerics
def test_products_of_many_rows_use_the_layers_own_weights():
    layer = Dense(6)
    layer.build((None, 5))
    zeros = [(np.zeros((5, 3), "float32"), np.zeros(3, "float32"))] * 2
    limit = dispatch.COLUMN_BLOCK_MAX_ROWS
    with dispatch.using_column_blocks({id(layer): zeros}):
        assert np.abs(layer(np.ones((limit, 5), "float32")).numpy()).max() == 0
        np.testing.assert_array_equal(layer(np.ones((limit + 1, 5), "float32")).numpy(),
                                      layer(np.ones((limit + 1, 5), "float32"),
                                            training=True).numpy())


def test_rows_unknown_when_traced_are_checked_when_run():
    layer = Dense(6)
    layer.build((None, 5))
    zeros = [(np.zeros((5, 3), "float32"), np.zeros(3, "float32"))] * 2

    @tf.function(input_signature=[tf.TensorSpec([None, 5], tf.float32)])
    def traced(x):
        with dispatch.using_column_blocks({id(layer): zeros}):
            return layer(x)

    limit = dispatch.COLUMN_BLOCK_MAX_ROWS
    assert np.abs(traced(np.ones((limit, 5), "float32")).numpy()).max() == 0
    many = np.ones((limit + 1, 5), "float32")
    np.testing.assert_array_equal(traced(many).numpy(), layer(many).numpy())


@pytest.mark.numerics
def test_table_logits_in_row_blocks_are_the_same_product():
    rng = np.random.default_rng(7)
    table = TokenEmbedding(50, 8)
    table.build((None, None))
    x = rng.standard_normal((2, 3, 8)).astype("float32")
    whole = table.logits(x).numpy()
    blocks = column_blocks.split(table.embeddings.numpy(), 3, 0)
    with dispatch.using_column_blocks({id(table): blocks}):
        blocked = table.logits(x).numpy()
    assert blocked.shape == (2, 3, 50)
    bound = product_bound(x.reshape(-1, 8), table.embeddings.numpy().T).reshape(2, 3, 50)
    assert np.all(np.abs(blocked - whole) <= bound)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Two tiny models (tied table; untied projection with bias) with their
    translators at 1 and 2 blocks; everything in-process computed here (the
    per-test seeding destroys the tokenizer's eager resource)."""
    keras.utils.set_random_seed(20261127)
    tokenizer = SubwordTokenizer(train_sentencepiece(CORPUS, vocab_size=400))
    out = {}
    for tied in (True, False):
        # The exported model has two layers (its blocks are named apart
        # across layers); the other one, whose checks do not depend on depth.
        config = kt.get_config("tiny", vocab_size=tokenizer.vocab_size, dropout=0.0,
                               max_length=24, tie_output_projection=tied,
                               num_layers=2 if tied else 1)
        model = kt.Transformer(config)
        model.build()
        plain = Translator(model, tokenizer, beam_size=3, alpha=0.6, extra_length=5)
        blocked = Translator(model, tokenizer, beam_size=3, alpha=0.6, extra_length=5,
                             xla_column_blocks=2)
        result = {
            "plain_xla": plain.translate(SENTENCES, batch_size=4, jit_compile=True),
            "blocked_xla": blocked.translate(SENTENCES, batch_size=4, jit_compile=True),
            "blocked_graph": blocked.translate(SENTENCES),
            "plain_graph": plain.translate(SENTENCES),
            "variables": len(blocked.column_block_variables),
            "weights": [(v.name, v.numpy()) for v in blocked.column_block_variables],
            "config": config,
        }
        if tied:
            path = export_translator(blocked, tmp_path_factory.mktemp("export"), name="blocks")
            result["path"] = path
        # Zeroed blocks must change what the XLA search computes and only that.
        for variable in blocked.column_block_variables:
            variable.assign(tf.zeros_like(variable))
        result["zeroed_xla"] = blocked.translate(SENTENCES, batch_size=4, jit_compile=True)
        result["zeroed_graph"] = blocked.translate(SENTENCES)
        out[tied] = result
    return out


def assert_same_search(a, b):
    """Same translations, scores equal to float32 rounding; a hypothesis may
    change only where two scored alike (a near tie on random weights)."""
    (texts_a, scores_a), (texts_b, scores_b) = a, b
    np.testing.assert_allclose(scores_a, scores_b, rtol=1e-5, atol=1e-5)
    assert sum(x == y for x, y in zip(texts_a, texts_b)) >= len(texts_a) - 1


@pytest.mark.parametrize("tied", [True, False])
def test_translator_blocks_give_the_same_translations(tiny, tied):
    result = tiny[tied]
    assert_same_search(result["plain_xla"], result["blocked_xla"])
    assert result["plain_graph"] == result["blocked_graph"]
    config = result["config"]
    # Each decoder Dense (4 attention + 2 feed-forward per layer, x2 for the
    # cross-attention's) and the output projection, in 2 blocks.
    per_layer = (4 + 4 + 2) * 2 * 2  # kernels and biases
    output = 2 if tied else 4
    assert result["variables"] == config.num_layers * per_layer + output


@pytest.mark.parametrize("tied", [True, False])
def test_only_the_xla_search_uses_the_blocks(tiny, tied):
    result = tiny[tied]
    assert result["zeroed_graph"] == result["plain_graph"]
    # Zero weights make every token equally likely: the scores change.
    assert not np.allclose(result["zeroed_xla"][1], result["plain_xla"][1], atol=1e-3)


def test_exported_blocks_are_saved_and_served(tiny):
    import tensorflow_text  # noqa: F401  (the SentencePiece ops, for loading)

    result = tiny[True]
    metadata = read_metadata(result["path"])
    assert metadata["xla_column_blocks"] == 2
    loaded = tf.saved_model.load(result["path"])
    saved = [(v.name, v.numpy()) for v in loaded.column_block_variables]
    assert [name for name, _ in saved] == [name for name, _ in result["weights"]]
    assert len({name for name, _ in saved}) == len(saved)  # each block named apart
    for (_, value), (_, expected) in zip(saved, result["weights"]):
        np.testing.assert_array_equal(value, expected)
    served = loaded.signatures["translate_xla"](text=tf.constant(SENTENCES))
    texts = [t.decode() for t in served["translation"].numpy()]
    assert_same_search(result["blocked_xla"], (texts, served["score"].numpy().tolist()))
    # The signature multiplies by the saved blocks (its batch is unknown
    # when traced): zeroed, they change its scores, and only its.
    default = loaded.signatures["serving_default"](text=tf.constant(SENTENCES))
    for variable in loaded.column_block_variables:
        variable.assign(tf.zeros_like(variable))
    zeroed = loaded.signatures["translate_xla"](text=tf.constant(SENTENCES))
    assert not np.allclose(zeroed["score"].numpy(), served["score"].numpy(), atol=1e-3)
    again = loaded.signatures["serving_default"](text=tf.constant(SENTENCES))
    np.testing.assert_array_equal(again["score"].numpy(), default["score"].numpy())


def test_translator_refuses_bad_block_counts(tiny):
    config = tiny[True]["config"]
    model = kt.Transformer(config)
    model.build()
    tokenizer = SubwordTokenizer(train_sentencepiece(CORPUS, vocab_size=400))
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="`xla_column_blocks` must be an int >= 1"):
            Translator(model, tokenizer, xla_column_blocks=bad)
    with pytest.raises(ValueError, match="Cannot cut"):
        Translator(model, tokenizer, xla_column_blocks=config.d_model + 1)


def test_kt_export_flag_checks(tmp_path, capsys):
    from keras_transformer.cli import export as cli

    for argv, message in (
        (["--xla-column-blocks", "0"], "--xla-column-blocks must be at least 1"),
        (["--format", "ctranslate2", "--xla-column-blocks", "2"],
         "--xla-column-blocks applies to --format saved_model"),
    ):
        parser = cli.build_parser()
        args = parser.parse_args(["--run-dir", str(tmp_path)] + argv)
        if args.format == "ctranslate2":
            pytest.importorskip("ctranslate2")
        with pytest.raises(SystemExit) as exit_info:
            cli.check_arguments(parser, args)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
