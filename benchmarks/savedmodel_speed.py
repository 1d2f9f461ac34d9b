"""Measures an exported translator on this machine: beam-search throughput
(sentences/s over batches) and single-sentence latency (p50, p95), through
one of the SavedModel's signatures, as TF Serving would run it:
`serving_default` (stock server) or `translate_xla` (a server started with
`--xla_cpu_compilation_enabled=true`; the first request of each shape
bucket compiles, so each is warmed up first).

    python -m benchmarks savedmodel                      # a random `small` model
    python -m benchmarks savedmodel --saved-model saved_models/de_en
    python -m benchmarks savedmodel --signature translate_xla
    python -m benchmarks savedmodel --saved-model NEW --baseline OLD

With --baseline it measures two exports in one process, in alternating
rounds, and prints the ratios (per round, then their median): whether a new
export is faster than the one being served, on this machine.

Without --saved-model it builds the `small` config with random weights and a
SentencePiece vocabulary trained on the source file, and exports it to a
temporary directory. Random weights rarely produce eos, so every sentence
decodes to the length limit (source + extra length): a worst case.
"""

import json
import os
import tempfile
import time

import numpy as np
import tensorflow as tf

from benchmarks import harness

DEFAULT_SOURCE = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data",
                              "multi30k", "test_2016_flickr.de.gz")


def build_random_saved_model(sentences, directory, args):
    import keras

    import keras_transformer as kt
    from keras_transformer.export import Translator, export_translator
    from keras_transformer.tokenizer import SubwordTokenizer, train_sentencepiece

    keras.utils.set_random_seed(0)
    tokenizer = SubwordTokenizer(train_sentencepiece(sentences, vocab_size=args.vocab_size))
    config = kt.get_config(args.config, vocab_size=tokenizer.vocab_size, dropout=0.0,
                           max_length=256)
    model = kt.Transformer(config)
    model.build()
    translator = Translator(model, tokenizer, beam_size=args.beam_size, alpha=args.alpha,
                            extra_length=args.extra_length)
    return export_translator(translator, directory, name="benchmark")


def time_batches(serve, batches):
    """Seconds to translate `batches` (lists of strings) one after another."""
    start = time.perf_counter()
    for batch in batches:
        serve(text=tf.constant(batch))["translation"].numpy()
    return time.perf_counter() - start


def time_singles(serve, sentences):
    """Seconds of each single-sentence request, in order."""
    return harness.seconds_each(
        lambda sentence: serve(text=tf.constant([sentence]))["translation"].numpy(), sentences)


def translations(serve, batches):
    """Every batch's translations, joined (also warms up: under XLA the
    first request of each shape bucket compiles)."""
    return [t for batch in batches for t in serve(text=tf.constant(batch))["translation"].numpy()]


def summary(throughput, latencies, metadata):
    return {
        "beam_size": metadata["beam_size"], "alpha": metadata["alpha"],
        "extra_length": metadata["extra_length"],
        "throughput_sentences_per_s": round(throughput, 2),
        "latency_p50_ms": round(1000 * float(np.percentile(latencies, 50)), 1),
        "latency_p95_ms": round(1000 * float(np.percentile(latencies, 95)), 1),
        "latency_runs": len(latencies),
    }


def measure(serve, metadata, batches, singles, rounds):
    """Times `serve["model"]` and, if given, `serve["baseline"]` (callables
    `serve(text=strings) -> {"translation": ...}`) on `batches` and on each
    of `singles` alone, `rounds` times each.

    Returns: `summary` per name; with a baseline also the per-round ratios'
    median and range, `throughput_ratio` and `latency_p50_ratio` (baseline
    time over model time: above 1, the model is faster), and whether the
    two translated `batches` alike.
    """
    names = [name for name in ("model", "baseline") if name in serve]
    outputs = {}
    for name in names:
        outputs[name] = translations(serve[name], batches)
        time_singles(serve[name], singles)  # warm up the batch-1 shapes
    # Alternating rounds (AB BA AB ...) so that drift in the machine's speed
    # hits both models alike; the ratios are per round, then their median.
    seconds = {name: 0.0 for name in names}
    latencies = {name: [] for name in names}
    round_ratios = {"throughput": [], "latency_p50": []}
    for _, order in harness.flipped(names, rounds):
        this_round = {}
        for name in order:
            elapsed = time_batches(serve[name], batches)
            single = time_singles(serve[name], singles)
            seconds[name] += elapsed
            latencies[name] += single
            this_round[name] = (elapsed, float(np.median(single)))
        if "baseline" in serve:
            for key, index in (("throughput", 0), ("latency_p50", 1)):
                round_ratios[key].append(this_round["baseline"][index]
                                         / this_round["model"][index])
    sentences = rounds * sum(len(batch) for batch in batches)
    result = {name: summary(sentences / seconds[name], latencies[name], metadata[name])
              for name in names}
    if "baseline" in serve:
        for key, ratios in round_ratios.items():
            result[f"{key}_ratio"] = round(float(np.median(ratios)), 3)
            result[f"{key}_ratio_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
        # Reported, not enforced: a re-export in another precision may
        # legitimately translate a few sentences differently.
        result["same_translations"] = outputs["model"] == outputs["baseline"]
    return result


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--saved-model", help="an exported model (default: build one)")
    parser.add_argument("--baseline",
                        help="a second exported model, measured in the same process "
                             "through the same signature, alternating rounds; prints "
                             "both and the ratios (above 1: --saved-model is faster)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="measurement rounds per model (default 1, or 4 with "
                             "--baseline); each round is the throughput run and the "
                             "latency requests")
    parser.add_argument("--source", default=DEFAULT_SOURCE,
                        help="sentences to translate, one per line (.gz ok)")
    parser.add_argument("--config", default="small", help="preset for the random model")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--extra-length", type=int, default=50)
    parser.add_argument("--num-sentences", type=int, default=256,
                        help="sentences for the throughput run")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--latency-runs", type=int, default=50,
                        help="single-sentence requests for the latency percentiles "
                             "(per round)")
    parser.add_argument("--signature", default="serving_default",
                        choices=["serving_default", "translate_xla"])
    args = parser.parse_args(argv)
    rounds = args.rounds if args.rounds is not None else (4 if args.baseline else 1)
    args.rounds = rounds
    harness.at_least(parser, args, ["rounds", "num_sentences", "batch_size", "latency_runs"])

    import tensorflow_text  # noqa: F401

    from keras_transformer.cli.common import read_lines
    from keras_transformer.export.saved_model import read_metadata, resolve_version

    # The exports given are found before any work (a random model's build
    # and export, the other model's load and compilation).
    paths = {}
    for name, flag, path in (("model", "--saved-model", args.saved_model),
                             ("baseline", "--baseline", args.baseline)):
        if path:
            try:
                paths[name] = resolve_version(path)
            except FileNotFoundError as error:
                parser.error(f"{flag}: {error}")

    sentences = [s.decode("utf-8", "replace") for s in read_lines(args.source)]
    test = sentences[: args.num_sentences]
    batches = sorted(test, key=len)
    batches = [batches[i:i + args.batch_size] for i in range(0, len(batches), args.batch_size)]
    singles = sentences[: args.latency_runs]
    with tempfile.TemporaryDirectory() as tmp:
        if "model" not in paths:
            paths["model"] = resolve_version(build_random_saved_model(sentences, tmp, args))
        serve, metadata = {}, {}
        for name, path in paths.items():
            signatures = tf.saved_model.load(path).signatures
            if args.signature not in signatures:
                raise SystemExit(f"{path} has no signature {args.signature!r}; "
                                 f"it has {sorted(signatures)}")
            serve[name] = signatures[args.signature]
            metadata[name] = read_metadata(path)
        measured = measure(serve, metadata, batches, singles, rounds)
    result = {
        "saved_model": args.saved_model or f"random {args.config} model",
        "signature": args.signature,
        **measured.pop("model"),
        "num_sentences": len(test), "batch_size": args.batch_size, "rounds": rounds,
        "cpu_threads": os.cpu_count(),
    }
    if args.baseline:
        result["baseline"] = {"saved_model": args.baseline, **measured.pop("baseline")}
    result.update(measured)
    print(json.dumps(result, indent=2))
    return result

