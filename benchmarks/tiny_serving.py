"""A tiny exported translator and `kt-serve` run as a subprocess, for the
serving benchmark (`serve_load`) and the serving tests (which import it
through tests/support/serving_model.py).

    path = export_tiny_model(tmp_path / "saved_models")   # .../tiny/1
    process, url = start_server(["--model-name", "tiny",
                                 "--model-base-path", os.path.dirname(path)])
    try:
        ...  # requests to url + "/v1/models/tiny:predict"
    finally:
        stop_server(process)
"""

import os
import re
import sys

from benchmarks import harness

# The tiny model's vocabulary is trained on this many pairs of the built-in
# corpus (both sides).
VOCABULARY_PAIRS = 400

MAX_LENGTH = 20
# The server, not the model, is what these measure and test: one encoder and
# one decoder layer load and trace sooner than the preset's two.
NUM_LAYERS = 1
# The line kt-serve prints to stdout once it listens.
READY = re.compile(r"kt-serve: serving (?P<name>\S+) version (?P<version>\d+) at "
                   r"(?P<url>http://\S+)")
# The line before it when kt-serve serves gRPC too (--port).
GRPC_READY = re.compile(r"kt-serve: gRPC at (?P<target>\S+)")


def export_tiny_model(directory, name="tiny", version=None, examples=None, seed=20261126,
                      num_layers=NUM_LAYERS):
    """Builds a tiny random translator (the `tiny` preset with `num_layers`
    encoder and decoder layers, max_length 20; one SentencePiece vocabulary
    of 400 pieces trained on both sides of `VOCABULARY_PAIRS` pairs of the
    built-in corpus; beam 3, alpha 0.6, extra length 4) from `seed` and
    exports it.

    Args:
        directory: the export's output directory (the model lands in
            `<directory>/<name>/<version>/`).
        name, version, examples: as `export_translator`'s.
        seed: the weights' seed; another seed gives another model.
        num_layers: the depth (another depth, another model).

    Returns: the version directory's path (str).
    """
    from keras_transformer.export import export_translator

    translator, _ = _tiny_translator(seed, num_layers)
    return export_translator(translator, str(directory), name=name, version=version,
                             examples=examples)


def export_tiny_ctranslate2(directory, name="tiny", version=1, examples=None,
                            seed=20261126, quantization="float32", num_layers=NUM_LAYERS):
    """`export_tiny_model`'s model (the same weights for the same `seed`
    and `num_layers`) as a CTranslate2 export,
    `<directory>/<name>/<version>/`, with the same search defaults. Returns
    the version directory's path (str)."""
    from keras_transformer.export.ctranslate2 import export_ctranslate2

    translator, model = _tiny_translator(seed, num_layers)
    return export_ctranslate2(
        model, translator.tokenizer, translator.tokenizer,
        os.path.join(str(directory), name, str(version)), quantization=quantization,
        beam_size=translator.beam_size, alpha=translator.alpha,
        extra_length=translator.extra_length, examples=examples)


def export_tiny_versions(directory, seeds, name="tiny", examples=None):
    """Exports versions 1, 2, ... of `<directory>/<name>/`, one per seed:
    each the model `export_tiny_model` builds from that seed. Faster than
    `export_tiny_model` per seed: one translator is traced once and
    exported with each seed's weights in turn.

    Returns: the version directories' paths (str), in the order of `seeds`.
    """
    import keras

    import keras_transformer as kt
    from keras_transformer.export import export_translator

    translator, model = _tiny_translator(seeds[0])
    paths = []
    for i, seed in enumerate(seeds):
        if i:
            keras.utils.set_random_seed(seed)
            fresh = kt.Transformer(model.config)
            fresh.build()
            model.set_weights(fresh.get_weights())
        paths.append(export_translator(translator, str(directory), name=name,
                                       version=i + 1, examples=examples))
    return paths


def _tiny_translator(seed, num_layers=NUM_LAYERS):
    """`(Translator, its model)` as `export_tiny_model` describes."""
    import keras

    import keras_transformer as kt
    from keras_transformer.data.synthetic import generate_corpus
    from keras_transformer.export import Translator
    from keras_transformer.tokenizer import SubwordTokenizer, train_sentencepiece

    # Seeded before the tokenizer exists: seeding destroys eager tf-text
    # resources.
    keras.utils.set_random_seed(seed)
    sources, targets = generate_corpus(num_train=VOCABULARY_PAIRS, num_val=0,
                                       num_test=0)["train"]
    tokenizer = SubwordTokenizer(train_sentencepiece(sources + targets, vocab_size=400))
    config = kt.get_config("tiny", vocab_size=tokenizer.vocab_size, dropout=0.0,
                           max_length=MAX_LENGTH, num_layers=num_layers)
    model = kt.Transformer(config)
    model.build()
    return Translator(model, tokenizer, beam_size=3, alpha=0.6, extra_length=4), model


def _command():
    """kt-serve beside this Python (the console script), else the module."""
    script = os.path.join(os.path.dirname(sys.executable), "kt-serve")
    if os.path.exists(script):
        return [script]
    return [sys.executable, "-m", "keras_transformer.cli.serve"]


def start_server(argv, timeout=120, env=None):
    """Starts `kt-serve <argv> --rest-api-port 0` (CPU only, TensorFlow's
    info lines off) and waits for its ready line.

    Returns: `(process, base_url)`, e.g. `(Popen, "http://127.0.0.1:40123")`;
    with `--port` in `argv`, `process.grpc_target` is the gRPC `host:port`.
    `process.stderr_path` is a file holding the server's stderr until
    `stop_server`, which removes it and keeps its text in
    `process.stderr_text`.

    `env`: variables added to the server's environment (e.g. PYTHONPATH
    naming another commit's package).

    Raises: `RuntimeError` with the server's stderr if it exits or stays
    silent for `timeout` seconds.
    """
    grpc = {}

    def note_grpc(line):
        match = GRPC_READY.search(line)
        if match:
            grpc["target"] = match.group("target")

    process, match = harness.start_process(
        _command() + list(argv) + ["--rest-api-port", "0"], READY, timeout, env, note_grpc)
    if grpc:
        process.grpc_target = grpc["target"]
    return process, match.group("url")


# Stops a server `start_server` started: SIGTERM (uvicorn's graceful
# shutdown), SIGKILL after `timeout` seconds; its stderr moves into
# `process.stderr_text`; returns the exit status.
stop_server = harness.stop_process
