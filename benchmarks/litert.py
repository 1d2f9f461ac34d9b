"""A LiteRT export against the SavedModel of the same weights: equality,
BLEU of dynamic-int8 and float16 against float32, file sizes, one-sentence latency
and sentences/s on one thread.

    python -m benchmarks litert --saved-model saved_models/demo \\
        --litert-model saved_models/demo_litert/1 \\
        --litert-int8 saved_models/demo_litert/2 \\
        --litert-float16 saved_models/demo_litert/3 \\
        --ctranslate2-model saved_models/demo_ct2 --sentences 500

The sentences are the built-in corpus's held-out ones (what kt-demo scores
on). Equality: identical translations counted, and the largest score
difference among them. Latency: the median of `--singles` one-sentence
calls per engine, the engines taking turns sentence by sentence so that a
change in the machine's load falls on all; sentences/s: the same
sentences one call each (LiteRT takes one per call). The result goes to
`benchmarks/results/<cpu>_<date>_<commit>_litert.json`.
"""

import os
import statistics
import time

from benchmarks import harness
from benchmarks.model_card import directory_bytes


def equality(reference, other):
    """`{identical, of, max_score_diff}`: translations compared one by one;
    scores of the identical ones."""
    same = [i for i, (a, b) in enumerate(zip(reference[0], other[0])) if a == b]
    diff = max((abs(reference[1][i] - other[1][i]) for i in same), default=0.0)
    return {"identical": len(same), "of": len(reference[0]), "max_score_diff": diff}


def latencies(engines, sentences):
    """`{name: [seconds per one-sentence call]}`, the engines taking turns
    in an order that rotates from sentence to sentence."""
    times = {name: [] for name in engines}
    names = list(engines)
    for i, sentence in enumerate(sentences):
        for name in names[i % len(names):] + names[:i % len(names)]:
            times[name] += harness.seconds_each(engines[name], [[sentence]])
    return times


def main(argv=None):
    parser = harness.parser(__doc__, prog="python -m benchmarks litert", allow_abbrev=True)
    parser.add_argument("--saved-model", required=True)
    parser.add_argument("--litert-model", required=True, help="the float32 export")
    parser.add_argument("--litert-int8", help="the dynamic-int8 export")
    parser.add_argument("--litert-float16", help="the float16 export")
    parser.add_argument("--ctranslate2-model", help="an int8 CTranslate2 export, for latency")
    parser.add_argument("--sentences", type=int, default=500)
    parser.add_argument("--singles", type=int, default=100,
                        help="one-sentence calls per engine for the latency")
    parser.add_argument("--json", help="the result file (default: benchmarks/results/...)")
    args = parser.parse_args(argv)

    from keras_transformer.evaluation import score_translations
    from keras_transformer.export import load_translator
    from keras_transformer.export.litert_translator import LiteRTTranslator

    fields = harness.record()
    sources, references = harness.held_out(args.sentences)
    saved = load_translator(args.saved_model)
    engines = {"saved_model": lambda batch: saved.translate(batch, jit_compile=False),
               "litert_float32": LiteRTTranslator(args.litert_model).translate}
    sizes = {"saved_model": directory_bytes(saved.path),
             "litert_float32": os.path.getsize(os.path.join(args.litert_model, "model.tflite"))}
    quantized = {"litert_dynamic_int8": args.litert_int8, "litert_float16": args.litert_float16}
    for name, path in quantized.items():
        if path:
            engines[name] = LiteRTTranslator(path).translate
            sizes[name] = os.path.getsize(os.path.join(path, "model.tflite"))
    if args.ctranslate2_model:
        from keras_transformer.export.ctranslate2_translator import CTranslate2Translator

        ct2 = CTranslate2Translator(args.ctranslate2_model, intra_threads=1)
        engines["ctranslate2"] = ct2.translate
        sizes["ctranslate2"] = directory_bytes(ct2.model_dir)

    outputs, seconds = {}, {}
    for name, translate in engines.items():
        start = time.perf_counter()
        if name.startswith("litert"):
            outputs[name] = translate(sources)
        else:  # one sentence per call, as LiteRT
            pairs = [translate([s]) for s in sources]
            outputs[name] = ([p[0][0] for p in pairs], [p[1][0] for p in pairs])
        seconds[name] = time.perf_counter() - start
        print(f"{name}: {len(sources) / seconds[name]:.1f} sentences/s", flush=True)
    document = {**fields, "kind": "litert", "sentences": len(sources),
                "sizes_bytes": sizes,
                "sentences_per_second_one_per_call": {
                    name: len(sources) / s for name, s in seconds.items()},
                "equality_with_saved_model": {
                    name: equality(outputs["saved_model"], out)
                    for name, out in outputs.items() if name != "saved_model"},
                "bleu": {name: score_translations(out[0], references)["bleu"]
                         for name, out in outputs.items()}}
    for name, key in (("litert_dynamic_int8", "bleu_int8_against_float32"),
                      ("litert_float16", "bleu_float16_against_float32")):
        if name in outputs:
            document[key] = score_translations(outputs[name][0],
                                               outputs["litert_float32"][0])["bleu"]
    times = latencies(engines, sources[:args.singles])
    document["latency_p50_ms_one_sentence"] = {
        name: statistics.median(t) * 1e3 for name, t in times.items()}
    for key in ("equality_with_saved_model", "bleu", "latency_p50_ms_one_sentence",
                "sizes_bytes"):
        print(key, document[key], flush=True)
    harness.write_result(document, fields, "litert", args.json)
    return document
