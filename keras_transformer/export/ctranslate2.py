"""CTranslate2 export and engine: a `Transformer` as a CTranslate2 model
directory, translated with `ctranslate2.Translator` and SentencePiece.

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

from keras_transformer.decoding.common import check_min_length
from keras_transformer.decoding.search_options import OPTIONS, check_options
from keras_transformer.decoding.transformer_search import (
    DEFAULT_ALPHA,
    DEFAULT_BEAM_SIZE,
    DEFAULT_EXTRA_LENGTH,
    DEFAULT_MIN_LENGTH,
)
from keras_transformer.export.engine import TranslationEngine
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


class _Result:
    """A `ctranslate2.TranslationResult`'s hypotheses and scores."""

    __slots__ = ("hypotheses", "scores")

    def __init__(self, hypotheses, scores):
        self.hypotheses = hypotheses
        self.scores = scores


def decoding_limit(source_pieces, extra_length, max_length):
    """The most target tokens (eos included) for a source of
    `source_pieces` pieces (eos not counted): `min(source_pieces + 1 +
    extra_length, max_length)`, at least 1, the rule of the package's
    searches (`decoding.decoding_length` with the eos-terminated source
    length), given to CTranslate2 as `max_decoding_length`."""
    return max(1, min(source_pieces + 1 + extra_length, max_length))


def _ends_in_results(options):
    """Whether a search with `translate_batch` `options` shows in its
    results the step it ended at: greedy search (its one hypothesis ends
    there), and beam search at alpha > 0 with all `beam_size` hypotheses
    returned (it stops once it holds `beam_size` finished ones, the last
    ended there; at alpha 0 it stops when its best candidate is eos, which
    a better hypothesis finished earlier can hide)."""
    if options["beam_size"] == 1:
        return options.get("sampling_topk", 1) == 1
    return options["length_penalty"] > 0


class CTranslate2Translator(TranslationEngine):
    """Translates with an export directory: SentencePiece tokenizes, a
    `ctranslate2.Translator` searches, SentencePiece detokenizes. The same
    methods (`TranslationEngine`; no `explain`: the attention CTranslate2
    returns is one head's, as exported, where `explain` gives the mean over
    heads)
    and input rules as `keras_transformer.export.Translator`; None options
    are the export's defaults (`keras_transformer.json`; the paper's for an
    export that records none).

    Args:
        model_dir: a directory written by `export_ctranslate2`, or a
            directory of integer versions of them (the newest is used).
        device: "cpu" (or "cuda", "auto").
        compute_type: CTranslate2's compute type; "default" runs the model as
            it was saved (float32, or int8_float32 for an int8 export on CPU).
        intra_threads: threads per search (0: CTranslate2's default).
        inter_threads: searches that may run at once, from as many calling
            threads (CTranslate2's `inter_threads`).
        vocabulary_map: "auto" (use the export's `vmap.txt` if it has one,
            CTranslate2's `use_vmap`), "on" (it must have one) or "off".
        min_length: the fewest pieces before eos, CTranslate2's
            `min_decoding_length` (None: the export's, else 1), as the
            package's `min_length`: eos is masked before the softmax.
        output_bytes: translations as the bytes SentencePiece decodes
            (byte pieces that are not valid UTF-8 kept as they are, as the
            SavedModel's string outputs) instead of str.

    Input rules (as the package's Translator): text is decoded as UTF-8
    with invalid bytes replaced by U+FFFD; an empty or whitespace-only
    sentence gives "" and score 0.0; a source longer than `max_length - 1`
    pieces keeps its first `max_length - 1`, then eos; a translation has at
    most `decoding_limit(source pieces, extra_length, max_length)` tokens,
    eos included, per sentence, and each sentence's search is the one it
    would get alone under its limit.

    Batching: greedy search and beam search at alpha > 0 take the fast
    path, one `translate_batch` call per `batch_size` sentences (a request
    of a few sentences is one call), with a sentence that came within one
    token of its own limit searched again under that limit; sampling and
    beam search at alpha 0 go in batches of one limit each (`_search`).
    Tokenizing and detokenizing call SentencePiece's Python API, per
    sentence; no TensorFlow runs per call.

    Greedy search (`beam_size=1`, and `sample` at temperature 0) is the
    package's greedy search: the same tokens and scores (`log P`, eos
    included). A hypothesis that reaches the length limit without eos ends
    as in the package: its first `limit - 1` tokens, then eos, rescored
    with `score_batch` (CTranslate2 alone would stop it there without
    eos). Beam search differs from the package's in its rules:

    - `alpha` is CTranslate2's length penalty: a finished hypothesis scores
      `log P / length ** alpha` (length with eos), where the package uses
      GNMT's `log P / ((5 + length) / 6) ** alpha`. At alpha 0 both are
      `log P`.
    - A hypothesis finishes when eos is among the `beam_size` best
      candidates of a step (as in fairseq); the hypotheses that reach the
      length limit are the beam's survivors there, ended with eos as above
      (the package's beam also weighs eos-ended ones at the last step).
    - At alpha 0 a sentence stops when its best candidate is eos (nothing
      can beat it later), so n-best entries after the first may differ.
    - Samples come from CTranslate2's generator (`ctranslate2.set_random_seed`
      once per call): the same call gives the same samples, but a sentence's
      sample depends on its batch.
    """

    def __init__(self, model_dir, device="cpu", compute_type="default", intra_threads=0,
                 inter_threads=1, output_bytes=False, vocabulary_map="auto", min_length=None):
        import sentencepiece

        ctranslate2 = import_ctranslate2()
        self.model_dir = resolve_ctranslate2_dir(model_dir)
        self.metadata = read_ctranslate2_metadata(self.model_dir)
        from keras_transformer.config import TransformerConfig

        self.config = TransformerConfig.from_dict(self.metadata["config"])
        defaults = self.metadata.get("defaults", {})
        self.beam_size = defaults.get("beam_size", DEFAULT_BEAM_SIZE)
        self.alpha = defaults.get("alpha", DEFAULT_ALPHA)
        self.extra_length = defaults.get("extra_length", DEFAULT_EXTRA_LENGTH)
        self.min_length = defaults.get("min_length", DEFAULT_MIN_LENGTH) if min_length is None \
            else min_length
        check_min_length(self.min_length, tensor_ok=False)
        self.max_source_tokens = self.config.max_length - 1
        self._out_type = bytes if output_bytes else str
        has_map = os.path.isfile(os.path.join(self.model_dir, VOCABULARY_MAP_FILE))
        if vocabulary_map not in ("auto", "on", "off"):
            raise ValueError(f"vocabulary_map must be auto, on or off, received "
                             f"{vocabulary_map!r}.")
        if vocabulary_map == "on" and not has_map:
            raise FileNotFoundError(f"{self.model_dir} has no {VOCABULARY_MAP_FILE}: export "
                                    "with kt-export --vocabulary-map.")
        self.use_vmap = has_map and vocabulary_map != "off"

        self.source_processor = sentencepiece.SentencePieceProcessor(
            model_file=os.path.join(self.model_dir, self.metadata["source_sentencepiece"]))
        target = SentencePieceVocabulary.of(
            os.path.join(self.model_dir, self.metadata["target_sentencepiece"]))
        self.target_processor = target.processor
        self.target_tokens = target.tokens(self.config.output_vocab_size)
        self._target_ids = {token: i for i, token in enumerate(self.target_tokens)}
        # Ids that detokenize to nothing: bos, pad and rows past the pieces.
        self._dropped = {self.config.bos_id, self.config.pad_id}
        self._piece_count = target.piece_count
        self._ctranslate2 = ctranslate2
        self.translator = ctranslate2.Translator(
            self.model_dir, device=device, compute_type=compute_type,
            intra_threads=intra_threads, inter_threads=inter_threads)

    @property
    def compute_type(self):
        return self.translator.compute_type

    # Text <-> pieces -----------------------------------------------------------

    def source_pieces(self, sentence):
        """`sentence` (str or bytes) -> its source pieces, truncated to
        `max_source_tokens` (eos is CTranslate2's to add); `[]` when blank."""
        if isinstance(sentence, bytes):
            sentence = sentence.decode("utf-8", "replace")
        if not sentence.strip():
            return []
        return self.source_processor.encode(sentence, out_type=str)[: self.max_source_tokens]

    def detokenize(self, tokens):
        """CTranslate2's output tokens (eos removed) -> text."""
        ids = [self._target_ids[t] for t in tokens]
        ids = [i for i in ids if i not in self._dropped and i < self._piece_count]
        return self.target_processor.decode(ids, out_type=self._out_type)

    # Searches --------------------------------------------------------------------

    def _search(self, sentences, extra_length, batch_size, options):
        """Runs `translate_batch(**options)` over `sentences`; returns the
        results in input order (None for blank sentences), each as if its
        sentence were searched alone under its own length limit
        (`decoding_limit`), where CTranslate2 takes one limit per batch.

        The fast path, for the searches whose results show the step they
        ended at (`_ends_in_results`: greedy search, and beam search at
        alpha > 0): the sentences, sorted by length, go in batches of
        `batch_size` under their batch's largest limit, one
        `translate_batch` call each. A sentence whose hypotheses all end two
        or more tokens before its own limit is settled: its search never
        reached its own last step, where the two limits first differ.
        Otherwise (sampling, beam search at alpha 0, and the few sentences
        the fast path leaves unsettled) the sentences go in batches of one
        limit each."""
        extra_length = self.extra_length if extra_length is None else extra_length
        OPTIONS["extra_length"].check(extra_length)
        if batch_size < 1:
            raise ValueError(f"`batch_size` must be >= 1, received {batch_size}.")
        pieces = [self.source_pieces(s) for s in sentences]
        max_length = self.config.max_length
        limits = {i: decoding_limit(len(p), extra_length, max_length)
                  for i, p in enumerate(pieces) if p}
        results = [None] * len(sentences)
        unsettled = list(limits)
        if _ends_in_results(options):
            # A limit at or below min_length lowers min_decoding_length.
            fast = sorted((i for i in unsettled if limits[i] > self.min_length),
                          key=lambda i: len(pieces[i]))
            unsettled = [i for i in unsettled if limits[i] <= self.min_length]
            unsettled += self._search_fast(pieces, limits, fast, batch_size, options,
                                           results)
        by_limit = {}
        for i in unsettled:
            by_limit.setdefault(limits[i], []).append(i)
        alpha = options.get("length_penalty", 0.0)
        for limit, indices in sorted(by_limit.items()):
            for start in range(0, len(indices), batch_size):
                chunk = indices[start:start + batch_size]
                out = self._translate_batch([pieces[i] for i in chunk], limit,
                                            min(self.min_length, limit - 1), options)
                for i, result in zip(chunk, out):
                    results[i] = self._ended_with_eos(pieces[i], result, limit, alpha)
        return results

    def _search_fast(self, pieces, limits, indices, batch_size, options, results):
        """`_search`'s fast path over `indices` (sorted by length, each
        limit above `min_length`): fills `results` for the settled ones,
        returns the others. A beam search returns all its finished
        hypotheses (it stops holding `beam_size` of them), so the longest
        is the one of the step it ended at."""
        wanted = options["num_hypotheses"]
        every = dict(options, num_hypotheses=options["beam_size"])
        unsettled = []
        for start in range(0, len(indices), batch_size):
            chunk = indices[start:start + batch_size]
            out = self._translate_batch([pieces[i] for i in chunk],
                                        max(limits[i] for i in chunk), self.min_length, every)
            for i, result in zip(chunk, out):
                hypotheses = result.hypotheses
                if max(map(len, hypotheses)) + 2 > limits[i]:
                    unsettled.append(i)
                elif len(hypotheses) > wanted:
                    results[i] = _Result(hypotheses[:wanted], result.scores[:wanted])
                else:
                    results[i] = result
        return unsettled

    def _translate_batch(self, batch, limit, min_length, options):
        # CTranslate2 masks eos before the softmax, as the package's
        # `forbid_early_eos`.
        return self.translator.translate_batch(
            batch, max_decoding_length=limit, min_decoding_length=min_length,
            max_input_length=0, return_scores=True, use_vmap=self.use_vmap, **options)

    def _ended_with_eos(self, source, result, limit, alpha):
        """`result` with each hypothesis that reached `limit` tokens without
        eos ending as the package's searches end it: its first `limit - 1`
        tokens, then eos, scored by their teacher-forced log P (eos
        included) over `limit ** alpha`; the hypotheses re-sorted by score.
        CTranslate2 stops such a hypothesis without eos."""
        cut = [i for i, h in enumerate(result.hypotheses) if len(h) >= limit]
        if not cut:
            return result
        hypotheses = [list(h) for h in result.hypotheses]
        scores = list(result.scores)
        forced = self.translator.score_batch(
            [list(source)] * len(cut), [hypotheses[i][:limit - 1] for i in cut],
            max_input_length=0)
        for i, scored in zip(cut, forced):
            hypotheses[i] = hypotheses[i][:limit - 1]
            scores[i] = float(np.sum(scored.log_probs, dtype=np.float64)) / limit ** alpha
        order = sorted(range(len(scores)), key=lambda k: -scores[k])
        return _Result([hypotheses[k] for k in order], [scores[k] for k in order])

    def _options(self, beam_size, alpha):
        beam_size = self.beam_size if beam_size is None else beam_size
        alpha = self.alpha if alpha is None else alpha
        check_options({"beam_size": beam_size, "alpha": alpha},
                      {"vocabulary": self.config.output_vocab_size})
        return int(beam_size), float(alpha)

    def translate(self, sentences, beam_size=None, alpha=None, extra_length=None,
                  batch_size=32):
        """Beam search (greedy at `beam_size=1`): `(translations: list of
        str, scores: list of float)`, the scores `log P / length ** alpha`."""
        beam_size, alpha = self._options(beam_size, alpha)
        return self._best(self._search(sentences, extra_length, batch_size, dict(
            beam_size=beam_size, length_penalty=alpha, num_hypotheses=1)))

    def _best(self, results):
        """`(translations, scores)` of `_search`'s results' first
        hypotheses ("" and 0.0 for a blank sentence)."""
        translations, scores = [], []
        for result in results:
            if result is None:
                translations.append(self._out_type())
                scores.append(0.0)
            else:
                translations.append(self.detokenize(result.hypotheses[0]))
                scores.append(float(result.scores[0]))
        return translations, scores

    def translate_nbest(self, sentences, n, beam_size=None, alpha=None, extra_length=None,
                        batch_size=32):
        """The `n` best hypotheses of each sentence, best first: a list per
        sentence of `n` `(translation, score)` pairs (`("", 0.0)` for a blank
        sentence). Needs `1 <= n <= beam_size` (default beam: `max(n, the
        export's)`)."""
        if beam_size is None:
            beam_size = max(int(n), self.beam_size)
        beam_size, alpha = self._options(beam_size, alpha)
        OPTIONS["n"].check(n, {"beam_size": beam_size})
        results = self._search(sentences, extra_length, batch_size, dict(
            beam_size=beam_size, length_penalty=alpha, num_hypotheses=n))
        out = []
        for result in results:
            if result is None:
                out.append([(self._out_type(), 0.0)] * n)
                continue
            out.append([(self.detokenize(h), float(s))
                        for h, s in zip(result.hypotheses, result.scores)])
        return out

    def sample(self, sentences, temperature=1.0, top_k=0, top_p=1.0, seed=0,
               extra_length=None, batch_size=32):
        """One sample per sentence: `(translations, scores)`, the scores the
        model's untempered log P of the sampled tokens. `temperature` 0 is
        greedy; `top_k` 0 samples from the whole vocabulary; `top_p` in
        (0, 1]. `seed` seeds CTranslate2's generator only in threads that
        have not drawn from it yet (OpenNMT/CTranslate2#1757): unlike the
        SavedModel's, these samples differ from call to call."""
        check_options({"temperature": temperature, "top_k": top_k, "top_p": top_p,
                       "seed": seed})
        self._ctranslate2.set_random_seed(int(seed) % 2**32)
        options = dict(beam_size=1, length_penalty=0.0, num_hypotheses=1,
                       sampling_topk=1 if temperature == 0 else int(top_k),
                       sampling_topp=float(top_p),
                       sampling_temperature=float(temperature) if temperature else 1.0)
        return self._best(self._search(sentences, extra_length, batch_size, options))

    def score(self, sources, targets, batch_size=32):
        """Teacher-forced log-probabilities: for each `(source, target)` pair
        of piece lists (no eos), a float32 array of `len(target) + 1` values,
        the log P of each target piece and of eos, given bos and the source
        (eos appended)."""
        out = self.translator.score_batch(
            [list(s) for s in sources], [list(t) for t in targets],
            max_batch_size=batch_size, max_input_length=0)
        return [np.asarray(result.log_probs, np.float32) for result in out]


def ctranslate2_translator_from_run(run_dir, checkpoint=None, compute_type="default",
                                    intra_threads=0, beam_size=None, alpha=None,
                                    extra_length=None, min_length=None):
    """A `CTranslate2Translator` for a run directory's weights, converted
    now: the checkpoint `checkpoint` selects (`RunDirectory.resolve_checkpoint`)
    is exported in float32 to a temporary directory, loaded and the
    directory removed (CTranslate2 and SentencePiece hold the model in
    memory once loaded). `compute_type` "int8" quantizes as it loads, which
    gives the weights of `kt-export --quantization int8`.

    Args:
        run_dir: a run directory (or a `RunDirectory`).
        checkpoint: a `--checkpoint` selector or prefix (default "auto").
        compute_type, intra_threads: `CTranslate2Translator`'s.
        beam_size, alpha, extra_length, min_length: search defaults (None:
            the package's, `keras_transformer.decoding`); `alpha` is
            CTranslate2's length penalty.

    Returns: `(translator, reason)`, `reason` the checkpoint and why it was
    chosen, as `kt-export` prints it.
    """
    from keras_transformer.run_directory import RunDirectory
    from keras_transformer.training.checkpoints import averaged_if_asked

    import_ctranslate2()
    run = run_dir if isinstance(run_dir, RunDirectory) else RunDirectory(run_dir)
    prefix, reason = run.resolve_checkpoint(averaged_if_asked(run, checkpoint))
    model = run.load_model(prefix, quiet=True)
    source, target = run.load_tokenizers()
    with tempfile.TemporaryDirectory(prefix="kt-ctranslate2-") as tmp:
        path = export_ctranslate2(
            model, source, target, os.path.join(tmp, "model"),
            beam_size=DEFAULT_BEAM_SIZE if beam_size is None else beam_size,
            alpha=DEFAULT_ALPHA if alpha is None else alpha,
            extra_length=DEFAULT_EXTRA_LENGTH if extra_length is None else extra_length,
            min_length=DEFAULT_MIN_LENGTH if min_length is None else min_length)
        translator = CTranslate2Translator(path, compute_type=compute_type,
                                           intra_threads=intra_threads)
    return translator, reason
