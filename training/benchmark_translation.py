#!/usr/bin/env python
"""Measures an exported translator on this machine: beam-search throughput
(sentences/s over batches) and single-sentence latency (p50, p95), through
one of the SavedModel's signatures, as TF Serving would run it:
`serving_default` (stock server) or `translate_xla` (a server started with
`--xla_cpu_compilation_enabled=true`; the first request of each shape
bucket compiles, so each is warmed up first).

    python training/benchmark_translation.py                      # a random `small` model
    python training/benchmark_translation.py --saved-model saved_models/de_en
    python training/benchmark_translation.py --signature translate_xla

Without --saved-model it builds the `small` config with random weights and a
SentencePiece vocabulary trained on the source file, and exports it to a
temporary directory. Random weights rarely produce eos, so every sentence
decodes to the length limit (source + extra length): a worst case.
"""

if __name__ == "__main__":
    # Before TensorFlow loads: glibc malloc settings (see training/fast_malloc.py).
    import fast_malloc

    fast_malloc.apply()

import argparse
import json
import os
import tempfile
import time

import numpy as np
import tensorflow as tf

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


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--saved-model", help="an exported model (default: build one)")
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
                        help="single-sentence requests for the latency percentiles")
    parser.add_argument("--signature", default="serving_default",
                        choices=["serving_default", "translate_xla"])
    args = parser.parse_args(argv)

    import tensorflow_text  # noqa: F401

    from keras_transformer.export.cli import read_lines

    sentences = [s.decode("utf-8", "replace") for s in read_lines(args.source)]
    with tempfile.TemporaryDirectory() as tmp:
        path = args.saved_model or build_random_saved_model(sentences, tmp, args)
        from keras_transformer.export.saved_model import read_metadata, resolve_version

        path = resolve_version(path)
        serve = tf.saved_model.load(path).signatures[args.signature]
        metadata = read_metadata(path)

        test = sentences[: args.num_sentences]
        batches = sorted(test, key=len)
        batches = [batches[i:i + args.batch_size]
                   for i in range(0, len(batches), args.batch_size)]
        for batch in batches:  # warm up (XLA: compile every shape bucket)
            serve(text=tf.constant(batch))
        start = time.perf_counter()
        for batch in batches:
            serve(text=tf.constant(batch))["translation"].numpy()
        throughput = len(test) / (time.perf_counter() - start)

        latencies = []
        for sentence in sentences[: args.latency_runs]:  # warm up
            serve(text=tf.constant([sentence]))
        for sentence in sentences[: args.latency_runs]:
            start = time.perf_counter()
            serve(text=tf.constant([sentence]))["translation"].numpy()
            latencies.append(time.perf_counter() - start)
    result = {
        "saved_model": args.saved_model or f"random {args.config} model",
        "signature": args.signature,
        "beam_size": metadata["beam_size"], "alpha": metadata["alpha"],
        "extra_length": metadata["extra_length"],
        "num_sentences": len(test), "batch_size": args.batch_size,
        "throughput_sentences_per_s": round(throughput, 2),
        "latency_p50_ms": round(1000 * float(np.percentile(latencies, 50)), 1),
        "latency_p95_ms": round(1000 * float(np.percentile(latencies, 95)), 1),
        "latency_runs": len(latencies),
        "cpu_threads": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
