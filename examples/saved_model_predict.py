"""Translate with an exported SavedModel in plain TensorFlow, no keras_transformer.

Shows everything a program of your own needs to call each signature that
`kt-export` writes: import `tensorflow_text` before loading, load the
version directory, pass every input with its exact dtype (beam_size int32,
alpha float32, extra_length int32, seed int64, ...) and decode the string
outputs, which come back as bytes. It needs only `tensorflow` and
`tensorflow-text`, the two packages the SavedModel's ops come from.

    python examples/saved_model_predict.py saved_models/demo "the dog sees a cat"
    python examples/saved_model_predict.py saved_models/demo/1 "the dog sees a cat" \
        --beam-size 8 --alpha 1.0 --n 3 --seed 7

The path is a version directory (`saved_models/demo/1`) or the model's base
directory (`saved_models/demo`), from which the highest integer version is
taken. Options left out are the export's, read from
`<version>/assets.extra/translator.json`.
"""

import argparse
import json
import os
import sys

import tensorflow as tf
import tensorflow_text  # noqa: F401  (its SentencePiece ops: "Op type not registered" without)


def version_directory(path):
    """`path` if it holds `saved_model.pb`, else its highest integer
    subdirectory: `tf.saved_model.load` needs the version directory."""
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        return path
    versions = [int(d) for d in (os.listdir(path) if os.path.isdir(path) else [])
                if d.isascii() and d.isdigit()
                and os.path.exists(os.path.join(path, d, "saved_model.pb"))]
    if not versions:
        sys.exit(f"No SavedModel at {path}: expected saved_model.pb or <version>/saved_model.pb")
    return os.path.join(path, str(max(versions)))


def text(value):
    """A string output (bytes) as str."""
    return value.decode("utf-8")


def main(argv=None):
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("saved_model", help="saved_models/NAME or saved_models/NAME/VERSION")
    parser.add_argument("sentences", nargs="+", help="source sentences")
    parser.add_argument("--beam-size", type=int, help="default: the export's")
    parser.add_argument("--alpha", type=float, help="length penalty; default: the export's")
    parser.add_argument("--extra-length", type=int, help="default: the export's")
    parser.add_argument("--n", type=int, default=2, help="n-best list length (<= beam size)")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-k", type=int, default=0, help="0: off")
    parser.add_argument("--top-p", type=float, default=0.9, help="1: off")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--source-ids", default="10 11 12",
                        help="token ids for translate_ids: your SentencePiece model's "
                             "ids of one sentence, no eos")
    args = parser.parse_args(argv)

    path = version_directory(args.saved_model)
    loaded = tf.saved_model.load(path)
    with open(os.path.join(path, "assets.extra", "translator.json"), encoding="utf-8") as f:
        export = json.load(f)
    print(f"{path}: exported by TensorFlow {loaded.tensorflow_version}")
    print("signatures:", ", ".join(sorted(loaded.signatures)))
    print(f"export's options: beam_size={export['beam_size']} alpha={export['alpha']:g} "
          f"extra_length={export['extra_length']}")

    def call(name, **inputs):
        outputs = loaded.signatures[name](**inputs)
        return {key: value.numpy() for key, value in outputs.items()}

    def show(title, outputs):
        print(f"\n{title}")
        for source, translation, score in zip(args.sentences, outputs["translation"],
                                              outputs["score"]):
            print(f"  {source!r} -> {text(translation)!r}  score {score:.4f}")

    sentences = tf.constant(args.sentences, tf.string)
    # The signatures take no defaults: every input is given, with its dtype.
    search = {
        "beam_size": tf.constant(
            export["beam_size"] if args.beam_size is None else args.beam_size, tf.int32),
        "alpha": tf.constant(export["alpha"] if args.alpha is None else args.alpha,
                             tf.float32),
        "extra_length": tf.constant(
            export["extra_length"] if args.extra_length is None else args.extra_length,
            tf.int32),
    }
    options = " ".join(f"{key}={value.numpy():g}" for key, value in search.items())

    show("serving_default", call("serving_default", text=sentences))
    show("translate_xla (XLA compiles on the first call of each shape)",
         call("translate_xla", text=sentences))
    show(f"translate_with_options {options}",
         call("translate_with_options", text=sentences, **search))

    nbest = call("translate_nbest", text=sentences, n=tf.constant(args.n, tf.int32), **search)
    print(f"\ntranslate_nbest n={args.n} {options}")
    for source, translations, scores in zip(args.sentences, nbest["translations"],
                                            nbest["scores"]):
        print(f"  {source!r}")
        for rank, (translation, score) in enumerate(zip(translations, scores), 1):
            print(f"    {rank}. {text(translation)!r}  score {score:.4f}")

    sampling = {
        "temperature": tf.constant(args.temperature, tf.float32),
        "top_k": tf.constant(args.top_k, tf.int32),
        "top_p": tf.constant(args.top_p, tf.float32),
        "seed": tf.constant(args.seed, tf.int64),
        "extra_length": search["extra_length"],
    }
    show("translate_sample " + " ".join(f"{key}={value.numpy():g}"
                                        for key, value in sampling.items()),
         call("translate_sample", text=sentences, **sampling))

    explained = call("translate_explain", text=sentences, **search)
    print(f"\ntranslate_explain {options}")
    for b, source in enumerate(args.sentences):
        s, t = explained["source_length"][b], explained["target_length"][b]
        print(f"  {source!r} -> {text(explained['translation'][b])!r}  "
              f"score {explained['score'][b]:.4f}")
        for piece, log_p, weights in zip(explained["target_pieces"][b, :t],
                                         explained["token_log_probs"][b, :t],
                                         explained["alignment"][b, :t, :s]):
            attended = explained["source_pieces"][b, weights.argmax()]
            print(f"    {text(piece)!r}  log p {log_p:.4f}  "
                  f"attends most to {text(attended)!r}")

    source_ids = [int(i) for i in args.source_ids.split()]
    translated = call("translate_ids", source_ids=tf.constant([source_ids], tf.int32))
    output_ids = translated["translation_ids"][0].tolist()
    while output_ids and output_ids[-1] == export["config"]["pad_id"]:
        output_ids.pop()
    print("\ntranslate_ids (ids in, ids out, eos removed)")
    print(f"  {source_ids} -> {output_ids}  score {translated['score'][0]:.4f}")

if __name__ == "__main__":
    main()
