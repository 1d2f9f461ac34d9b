"""CTranslate2 export: a `Transformer` as a CTranslate2 model directory,
which `ctranslate2_translator.CTranslate2Translator` translates with
`ctranslate2.Translator` and SentencePiece.

CTranslate2 (https://github.com/OpenNMT/CTranslate2) is the CPU/GPU
inference engine that OpenNMT and fairseq models are converted to. The
export fills `ctranslate2.specs.TransformerSpec` from the model's weights,
the way CTranslate2's own converters do, and writes it with the spec's
`save`. The module itself calls no TensorFlow: it reads the weights and
the sinusoid through `keras.ops` (any backend), tokenizes with the
`sentencepiece` package (tokenizers may be given as SentencePiece model
bytes or files), and its engine runs on CTranslate2 and SentencePiece
(importing it still loads TensorFlow: the package does, and
`keras_transformer.tokenizer`, whose special-id rules it shares).

Layout of an export directory::

    model.bin, config.json          CTranslate2's model (weights, special tokens)
    shared_vocabulary.json          its vocabulary (or source_vocabulary.json
                                    and target_vocabulary.json when separate)
    shared.spm                      the SentencePiece model (or source.spm and
                                    target.spm when the vocabularies are separate)
    keras_transformer.json          what was exported (`read_ctranslate2_metadata`)
    examples.json                   example sentences for kt-serve (optional)
    vmap.txt                        a vocabulary map for `use_vmap` (optional,
                                    `export/vocabulary_map.py`)

kt-export writes it as a version, `<output-dir>/<name>_ct2/<version>/`, the
layout kt-serve serves; `CTranslate2Translator` takes either directory.

How the model maps onto CTranslate2 (every mapping is exact in float32):

- post-LN or pre-LN (`norm_first`: CTranslate2's `pre_norm`, with the final
  encoder and decoder LayerNorm), the LayerNorm epsilon
  (`layer_norm_epsilon` in CTranslate2's config);
- embeddings times sqrt(d_model) (`scale_embeddings`); the position table is
  written out, `config.max_length` rows: the sinusoid as this package
  computes it (sines and cosines interleaved, where CTranslate2's built-in
  one concatenates them), the learned table, or zeros for "none";
- a shared vocabulary (one embedding matrix for source, target and a tied
  projection; CTranslate2 stores it once) or separate ones; a tied or an
  untied output projection (with its bias);
- eos appended to every source (`add_source_eos`), decoding started with bos
  (`decoder_start_token`); the pad id of a SentencePiece model without a pad
  piece (`SubwordTokenizer.added_pad`) gets the vocabulary entry `<pad>`,
  and rows a model has beyond its tokenizer get `<unused_ID>` entries, so
  CTranslate2's ids are the model's.

Quantization (`QUANTIZATIONS`): "float32" (exact), "int8" and
"int8_float32" (the same file: int8 weights of every matrix and embedding,
one scale per row; CTranslate2 runs it as int8_float32 on CPU).
"""

import json
import os
import shutil
import tempfile

import numpy as np

from keras_transformer.decoding.transformer_search import (
    DEFAULT_ALPHA,
    DEFAULT_BEAM_SIZE,
    DEFAULT_EXTRA_LENGTH,
    DEFAULT_MIN_LENGTH,
)
from keras_transformer.export.vocabulary_map import VOCABULARY_MAP_FILE, write_vocabulary_map
from keras_transformer.files import honour_umask, replace_directory
from keras_transformer.tokenizer import ADDED_PAD_PIECE, sentencepiece_ids

QUANTIZATIONS = ("float32", "int8", "int8_float32")
METADATA_FILE = "keras_transformer.json"
SHARED_SENTENCEPIECE = "shared.spm"
SOURCE_SENTENCEPIECE = "source.spm"
TARGET_SENTENCEPIECE = "target.spm"
FORMAT_VERSION = 1
# What `pip install` needs for this module.
EXTRA = "ctranslate2"


def import_ctranslate2():
    """The `ctranslate2` module, or an `ImportError` naming the extra."""
    try:
        import ctranslate2
    except ImportError as e:
        raise ImportError(
            "The CTranslate2 export and engine need the `ctranslate2` package: "
            f"pip install 'attention-transformer-keras[{EXTRA}]' (or pip install "
            f"'ctranslate2>=4.5'); importing it failed: {e}"
        ) from e
    return ctranslate2


# Vocabularies ----------------------------------------------------------------


class SentencePieceVocabulary:
    """A SentencePiece model's pieces and special ids, read with the
    `sentencepiece` package under `SubwordTokenizer`'s rules
    (`tokenizer.sentencepiece_ids`: a model without a pad piece gets
    `pad_id = piece_count`, `added_pad = True`).

    Args:
        model_proto: the serialized SentencePiece model (`bytes`).

    Attributes: `model_proto`, `processor` (a `SentencePieceProcessor`),
    `piece_count`, `vocab_size`, `pad_id`, `unk_id`, `bos_id`, `eos_id`,
    `added_pad`.
    """

    def __init__(self, model_proto):
        self.model_proto = model_proto
        self.processor, ids = sentencepiece_ids(model_proto)
        for field, value in ids.items():
            setattr(self, field, value)

    @classmethod
    def of(cls, tokenizer):
        """From a `SubwordTokenizer` (anything with `model_proto`), a
        `SentencePieceVocabulary`, model bytes, or a model file's path."""
        if isinstance(tokenizer, cls):
            return tokenizer
        if hasattr(tokenizer, "model_proto"):
            return cls(tokenizer.model_proto)
        if isinstance(tokenizer, bytes):
            return cls(tokenizer)
        if isinstance(tokenizer, (str, os.PathLike)):
            with open(tokenizer, "rb") as f:
                return cls(f.read())
        raise TypeError("expected a SubwordTokenizer, SentencePiece model bytes or a model "
                        f"file, received {type(tokenizer).__name__}.")

    def tokens(self, size):
        """CTranslate2's vocabulary for an embedding of `size` rows: the
        pieces, `<pad>` for an added pad id, `<unused_ID>` for rows past the
        tokenizer; all distinct."""
        tokens = [self.processor.id_to_piece(i) for i in range(self.piece_count)]
        taken = set(tokens)
        for i in range(self.piece_count, size):
            name = ADDED_PAD_PIECE if (self.added_pad and i == self.pad_id) else f"<unused_{i}>"
            while name in taken:  # a model may define a piece of that name
                name = f"<{name}>"
            tokens.append(name)
            taken.add(name)
        return tokens

    def special(self, tokens):
        """`{"pad", "unk", "bos", "eos"}` -> `{"id", "piece"}` in `tokens`."""
        return {name: {"id": i, "piece": tokens[i]}
                for name, i in (("pad", self.pad_id), ("unk", self.unk_id),
                                ("bos", self.bos_id), ("eos", self.eos_id))}


# Export ------------------------------------------------------------------------


def check_exportable(config, source, target, quantization="float32"):
    """Raises `ValueError` naming the field and value for what CTranslate2
    cannot express or what does not fit together.

    Args:
        config: the model's `TransformerConfig`.
        source, target: `SentencePieceVocabulary`s.
        quantization: one of `QUANTIZATIONS`.
    """
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"`quantization` must be one of {QUANTIZATIONS}, received "
                         f"{quantization!r}.")
    if config.position_encoding not in ("sinusoidal", "learned", "none"):
        raise ValueError(f"`position_encoding` {config.position_encoding!r}: CTranslate2 "
                         "takes a position table; only 'sinusoidal', 'learned' and 'none' "
                         "are written as one.")
    sides = (("source", source, config.vocab_size, "vocab_size"),
             ("target", target, config.output_vocab_size,
              "vocab_size" if config.shared_vocabulary else "target_vocab_size"))
    for side, vocabulary, size, field in sides:
        for name in ("pad_id", "bos_id", "eos_id"):
            if getattr(config, name) != getattr(vocabulary, name):
                raise ValueError(
                    f"`{name}` ({getattr(config, name)}) differs from the {side} "
                    f"SentencePiece model's ({getattr(vocabulary, name)}): not the model's "
                    "tokenizer.")
        if vocabulary.vocab_size > size:
            raise ValueError(
                f"The {side} SentencePiece model has {vocabulary.vocab_size} ids but the "
                f"model's {side} vocabulary (`{field}`) only {size}: not the model's "
                "tokenizer.")
    # CTranslate2 names its special tokens once, for both vocabularies.
    source_tokens = source.tokens(config.vocab_size)
    target_tokens = target.tokens(config.output_vocab_size)
    for name, s_id, t_id in (("eos", config.eos_id, config.eos_id),
                             ("unk", source.unk_id, target.unk_id)):
        if source_tokens[s_id] != target_tokens[t_id]:
            raise ValueError(
                f"The source's {name} piece {source_tokens[s_id]!r} differs from the "
                f"target's {target_tokens[t_id]!r}: CTranslate2 names the {name} token once "
                "for both vocabularies.")


def export_ctranslate2(model, source_tokenizer, target_tokenizer, output_dir,
                       quantization="float32", beam_size=DEFAULT_BEAM_SIZE,
                       alpha=DEFAULT_ALPHA, extra_length=DEFAULT_EXTRA_LENGTH, examples=None,
                       vocabulary_map=None, min_length=DEFAULT_MIN_LENGTH):
    """Writes `model` as a CTranslate2 model directory (layout: the module
    docstring), atomically: into a temporary directory beside `output_dir`,
    then renamed. An existing `output_dir` is replaced once the new one is
    complete.

    Args:
        model: a built `Transformer`.
        source_tokenizer, target_tokenizer: the model's `SubwordTokenizer`s
            (the same one twice with a shared vocabulary), or SentencePiece
            model bytes or files.
        output_dir: the directory to write.
        quantization: "float32", "int8" or "int8_float32".
        beam_size, alpha, extra_length: search defaults recorded in
            `keras_transformer.json` for `CTranslate2Translator` (default:
            the paper's, `keras_transformer.decoding`); `alpha` is
            CTranslate2's length penalty (see `CTranslate2Translator`).
        examples: optional source sentences (str) for kt-serve's
            playground, written to `examples.json`.
        vocabulary_map: optional `{source piece: [target pieces]}`
            (`vocabulary_map.build_vocabulary_map`), written to `vmap.txt`
            for CTranslate2's `use_vmap`.
        min_length: the fewest pieces before eos (CTranslate2's
            `min_decoding_length`), recorded with the search defaults; 1:
            no empty translation for a non-empty sentence.

    Returns: `output_dir`.

    Raises: `ValueError` naming the field for what CTranslate2 cannot
    express (`check_exportable`); `ImportError` without `ctranslate2`.
    """
    ctranslate2 = import_ctranslate2()
    config = model.config
    if not model.built:
        raise ValueError("`model` must be built (call `model.build()` or run it once).")
    source = SentencePieceVocabulary.of(source_tokenizer)
    target = SentencePieceVocabulary.of(target_tokenizer)
    check_exportable(config, source, target, quantization)
    shared = config.shared_vocabulary
    if shared and source.model_proto != target.model_proto:
        raise ValueError("`target_vocab_size` is null (one shared vocabulary) but the source "
                         "and target SentencePiece models differ.")

    spec = _transformer_spec(ctranslate2, model)
    source_tokens = source.tokens(config.vocab_size)
    target_tokens = target.tokens(config.output_vocab_size)
    spec.register_source_vocabulary(source_tokens)
    spec.register_target_vocabulary(target_tokens)
    spec.config.unk_token = target_tokens[target.unk_id]
    spec.config.bos_token = target_tokens[config.bos_id]
    spec.config.eos_token = target_tokens[config.eos_id]
    spec.config.decoder_start_token = target_tokens[config.bos_id]
    spec.config.add_source_bos = False
    spec.config.add_source_eos = True
    spec.config.layer_norm_epsilon = float(config.layer_norm_epsilon)
    spec.validate()
    spec.optimize(quantization=quantization)

    files = ({SHARED_SENTENCEPIECE: source} if shared
             else {SOURCE_SENTENCEPIECE: source, TARGET_SENTENCEPIECE: target})
    metadata = {
        "format_version": FORMAT_VERSION,
        "config": config.to_dict(),
        "quantization": quantization,
        "ctranslate2_version": ctranslate2.__version__,
        "shared_vocabulary": shared,
        "source_sentencepiece": SHARED_SENTENCEPIECE if shared else SOURCE_SENTENCEPIECE,
        "target_sentencepiece": SHARED_SENTENCEPIECE if shared else TARGET_SENTENCEPIECE,
        "special_tokens": {
            "source": source.special(source_tokens),
            "target": target.special(target_tokens),
            "added_pad": {"source": source.added_pad, "target": target.added_pad},
        },
        "source_eos": True,
        "decoder_start": target_tokens[config.bos_id],
        "max_source_tokens": config.max_length - 1,
        "defaults": {"beam_size": int(beam_size), "alpha": float(alpha),
                     "extra_length": int(extra_length), "min_length": int(min_length)},
    }

    output_dir = os.path.abspath(os.fspath(output_dir))
    parent = os.path.dirname(output_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=f".tmp-{os.path.basename(output_dir)}-")
    try:
        spec.save(tmp)
        for name, vocabulary in files.items():
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(vocabulary.model_proto)
        with open(os.path.join(tmp, METADATA_FILE), "w", encoding="utf-8") as f:
            json.dump(metadata, f, indent=2, sort_keys=True)
        if vocabulary_map is not None:
            known = set(target.tokens(config.output_vocab_size))
            unknown = sorted({t for ts in vocabulary_map.values() for t in ts} - known)
            if unknown:
                raise ValueError(f"vocabulary_map names target pieces the model does not "
                                 f"have: {unknown[:5]}")
            write_vocabulary_map(os.path.join(tmp, VOCABULARY_MAP_FILE), vocabulary_map)
        if examples is not None:
            with open(os.path.join(tmp, "examples.json"), "w", encoding="utf-8") as f:
                json.dump([str(e) for e in examples], f, ensure_ascii=False, indent=0)
        honour_umask(tmp)  # mkdtemp's 0700 would keep other users out
        replace_directory(tmp, output_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return output_dir


def _numpy(variable):
    import keras

    return np.asarray(keras.ops.convert_to_numpy(variable), dtype=np.float32)


def _linear(spec, dense):
    """A Keras `Dense` (kernel `(in, out)`) into a CTranslate2 `LinearSpec`
    (weight `(out, in)`)."""
    spec.weight = np.ascontiguousarray(_numpy(dense.kernel).T)
    if dense.use_bias:
        spec.bias = _numpy(dense.bias)


def _fused(spec, denses):
    """Several `Dense` of one input as one `LinearSpec` (outputs
    concatenated), CTranslate2's layout for the q/k/v and k/v projections."""
    spec.weight = np.concatenate([_numpy(d.kernel).T for d in denses], axis=0)
    if any(d.use_bias for d in denses):
        spec.bias = np.concatenate([
            _numpy(d.bias) if d.use_bias else np.zeros([d.units], np.float32)
            for d in denses])


def _layer_norm(spec, norm):
    spec.gamma = _numpy(norm.gamma)
    spec.beta = _numpy(norm.beta)


def _feed_forward(spec, layer):
    if layer.feed_forward.activation not in ("relu", None):
        raise ValueError(f"feed-forward activation {layer.feed_forward.activation!r}: "
                         "the export writes ReLU.")
    _layer_norm(spec.layer_norm, layer.feed_forward_block.norm)
    _linear(spec.linear_0, layer.feed_forward.inner)
    _linear(spec.linear_1, layer.feed_forward.outer)


def _self_attention(spec, attention, block):
    _layer_norm(spec.layer_norm, block.norm)
    _fused(spec.linear[0], [attention.wq, attention.wk, attention.wv])
    _linear(spec.linear[1], attention.dense)


def _position_table(embedding, config):
    """`(max_length, d_model)` float32: what `PositionalEmbedding` adds at
    positions `0 .. max_length - 1`."""
    if config.position_encoding == "learned":
        return _numpy(embedding.positions.embeddings)
    if config.position_encoding == "none":
        return np.zeros([config.max_length, config.d_model], np.float32)
    from keras_transformer.layers.position_encoding import sinusoidal_position_encoding

    # The package's own function: the same values the model adds.
    return _numpy(sinusoidal_position_encoding(config.max_length, config.d_model))


def _transformer_spec(ctranslate2, model):
    """A filled `TransformerSpec` (weights only; vocabularies and config are
    the caller's)."""
    specs = ctranslate2.specs
    config = model.config
    spec = specs.TransformerSpec.from_config(
        (config.num_layers, config.decoder_layers), config.num_heads,
        pre_norm=config.norm_first, activation=specs.Activation.RELU)
    for side, embedding in ((spec.encoder, model.source_embedding),
                            (spec.decoder, model.target_embedding)):
        token_spec = side.embeddings[0] if isinstance(side.embeddings, list) else side.embeddings
        token_spec.weight = _numpy(embedding.token_embedding.embeddings)
        side.scale_embeddings = True  # times sqrt(d_model), as TokenEmbedding
        side.position_encodings.encodings = _position_table(embedding, config)

    for layer_spec, layer in zip(spec.encoder.layer, model.encoder.encoder_layers):
        _self_attention(layer_spec.self_attention, layer.self_attention,
                        layer.self_attention_block)
        _feed_forward(layer_spec.ffn, layer)
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder.decoder_layers):
        _self_attention(layer_spec.self_attention, layer.self_attention,
                        layer.self_attention_block)
        cross = layer.cross_attention
        _layer_norm(layer_spec.attention.layer_norm, layer.cross_attention_block.norm)
        _linear(layer_spec.attention.linear[0], cross.wq)
        _fused(layer_spec.attention.linear[1], [cross.wk, cross.wv])
        _linear(layer_spec.attention.linear[2], cross.dense)
        _feed_forward(layer_spec.ffn, layer)
    if config.norm_first:
        _layer_norm(spec.encoder.layer_norm, model.encoder.final_norm)
        _layer_norm(spec.decoder.layer_norm, model.decoder.final_norm)

    if model.output_projection is None:  # tied: logits = x E^T, no bias
        spec.decoder.projection.weight = _numpy(model.target_embedding.token_embedding.embeddings)
    else:
        _linear(spec.decoder.projection, model.output_projection)
    return spec


def resolve_ctranslate2_dir(path):
    """`path` itself if it is an export directory, else its newest integer
    version directory that is one (the layout kt-export writes and kt-serve
    serves, `<name>_ct2/<version>/`); `path` unchanged when neither."""
    path = os.fspath(path)
    if os.path.isfile(os.path.join(path, METADATA_FILE)) or not os.path.isdir(path):
        return path
    numbers = sorted(int(n) for n in os.listdir(path) if n.isdigit()
                     and os.path.isfile(os.path.join(path, n, METADATA_FILE)))
    return os.path.join(path, str(numbers[-1])) if numbers else path


def read_ctranslate2_metadata(model_dir):
    """`keras_transformer.json` of an export directory (or of the newest
    version under it, `resolve_ctranslate2_dir`), as a dict;
    `FileNotFoundError` naming the directory when it is not one."""
    path = os.path.join(resolve_ctranslate2_dir(model_dir), METADATA_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{model_dir}: not a CTranslate2 export of this package (no {METADATA_FILE}; "
            "write one with kt-export --format ctranslate2).")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


# Engine ------------------------------------------------------------------------
