"""The figures of a shipped model's card, for each engine: scores on the
Multi30k validation and test_2016_flickr splits (sacreBLEU with its
signature, chrF, and the Multi30k papers' tokenized BLEU), one-sentence
latency and sentences/s on one thread, the size in parameters and on disk.

    python -m benchmarks model-card --saved-model saved_models/multi30k_en_de \\
        --ctranslate2-model saved_models/multi30k_en_de_ct2 \\
        --data ../shared/data/multi30k

Each engine translates every split with its export's defaults (beam,
alpha, extra length), batches of `--batch-size` sentences. Latency: each of
the first `--singles` validation sentences alone, p50 and p95; throughput:
the first `--throughput-sentences` validation sentences in batches of
`--batch-size`. The engines alternate for `--rounds` rounds, and each
figure is the median over rounds. TensorFlow and CTranslate2 run on one
thread each (`--threads`).

`--litert-model DIR --engines litert` measures a LiteRT export of the
same model alone (`kt-export --saved-model ... --format litert`), and
counts, per split, its translations identical to the SavedModel's.

Writes `benchmarks/results/<cpu>_<date>_<commit>_model-card.json` (with
`--engines litert`, `..._model-card-litert.json`); the model card's figures
are read from those files (tests/test_shipped_model.py checks them against
them).
"""

import math
import os
import statistics
import time

from benchmarks import harness

SPLITS = ("val", "test_2016_flickr")


def read_lines(data, split, lang):
    """The lines of `split`'s `lang` file (.gz ok) in the directory `data`."""
    from keras_transformer.data.text_files import find_split_file

    return harness.read_text(find_split_file(data, split, lang))


def directory_bytes(path):
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(path) for name in names)


def parse_args(argv=None):
    parser = harness.parser(__doc__, prog="python -m benchmarks model-card")
    parser.add_argument("--saved-model", required=True, help="the SavedModel's base path")
    parser.add_argument("--ctranslate2-model", help="the CTranslate2 export's base path")
    parser.add_argument("--litert-model", help="a LiteRT export's directory")
    parser.add_argument("--engines", default="savedmodel,ctranslate2",
                        help="which engines to measure, of savedmodel, ctranslate2 and "
                        "litert (default: %(default)s)")
    parser.add_argument("--data", required=True,
                        help="the Multi30k directory (val and test_2016_flickr .en/.de)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--singles", type=int, default=50)
    parser.add_argument("--throughput-sentences", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="result file (default: benchmarks/results/...)")
    return parser.parse_args(argv)


def batched(translate, sentences, batch_size):
    out = []
    for start in range(0, len(sentences), batch_size):
        out.extend(translate(sentences[start:start + batch_size])[0])
    return out


def main(argv=None):
    args = parse_args(argv)
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    import keras_transformer as kt
    from keras_transformer.evaluation import score_translations
    from keras_transformer.export.ctranslate2_translator import CTranslate2Translator
    from keras_transformer.export.saved_model import resolve_version

    saved_model_path = resolve_version(args.saved_model)
    saved_model = kt.load_saved_model(saved_model_path)
    opened = {"savedmodel": lambda: saved_model,
              "ctranslate2": lambda: CTranslate2Translator(args.ctranslate2_model,
                                                           intra_threads=args.threads),
              "litert": lambda: litert_engine(args.litert_model, args.threads)}
    paths = {"savedmodel": args.saved_model, "ctranslate2": args.ctranslate2_model,
             "litert": args.litert_model}
    names = args.engines.split(",")
    engines = {name: opened[name]() for name in names}
    kind = "model-card" if names != ["litert"] else "model-card-litert"
    document = {**harness.record(), "kind": kind, "threads": args.threads,
                "saved_model": saved_model_path,
                "sizes_bytes": {name: directory_bytes(paths[name]) for name in names},
                "parameters": count_parameters(saved_model_path),
                "scores": {}, "speed": {}}
    for split in SPLITS:
        sources, references = (read_lines(args.data, split, "en"),
                               read_lines(args.data, split, "de"))
        reference_translations = None
        for name, engine in engines.items():
            hypotheses = batched(engine.translate, sources, args.batch_size)
            if name == "litert":
                if reference_translations is None:
                    reference_translations = batched(saved_model.translate, sources,
                                                     args.batch_size)
                document.setdefault("identical_to_savedmodel", {})[split] = sum(
                    a == b for a, b in zip(hypotheses, reference_translations))
            elif name == "savedmodel":
                reference_translations = hypotheses
            scores = score_translations(hypotheses, references, tokenized_bleu_lang="de")
            document["scores"].setdefault(name, {})[split] = {
                key: (round(value, 2) if isinstance(value, float) else value)
                for key, value in scores.items() if not key.endswith("_text")}
            print(name, split, scores["bleu_text"], scores["tokenized_bleu_text"],
                  flush=True)
    sentences = read_lines(args.data, "val", "en")
    singles, bulk = sentences[:args.singles], sentences[:args.throughput_sentences]
    timings = {name: {"p50_ms": [], "p95_ms": [], "sentences_per_second": []}
               for name in engines}
    for _, order in harness.flipped(engines, args.rounds):
        for name in order:
            engine = engines[name]
            engine.translate(singles[:1])  # warm
            latencies = sorted(1000 * s for s in harness.seconds_each(
                lambda sentence, engine=engine: engine.translate([sentence]), singles))
            start = time.perf_counter()
            batched(engine.translate, bulk, args.batch_size)
            rate = len(bulk) / (time.perf_counter() - start)
            timings[name]["p50_ms"].append(statistics.median(latencies))
            timings[name]["p95_ms"].append(latencies[int(0.95 * (len(latencies) - 1))])
            timings[name]["sentences_per_second"].append(rate)
    for name, values in timings.items():
        document["speed"][name] = {key: round(statistics.median(v), 1)
                                   for key, v in values.items()}
        print(name, document["speed"][name], flush=True)
    harness.write_result(document, document, kind, args.json)


def litert_engine(path, threads):
    from keras_transformer.export.litert_translator import LiteRTTranslator

    return LiteRTTranslator(path, threads=threads)


def count_parameters(saved_model_path):
    """The exported model's parameter count, read from its variables."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(os.path.join(saved_model_path, "variables",
                                                   "variables"))
    return sum(math.prod(shape) for name, shape in reader.get_variable_to_shape_map().items()
               if shape and "_CHECKPOINTABLE_OBJECT_GRAPH" not in name)
