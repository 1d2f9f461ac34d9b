"""The benchmarks' one entry point, run from the repository root:

    python -m benchmarks <subcommand> [flags]
    python -m benchmarks <subcommand> --help

Each subcommand hands the rest of the command line to its module's `main`.
"""

import importlib
import importlib.util
import os
import sys

# subcommand -> (module under benchmarks/, one line for --help)
SUBCOMMANDS = {
    "speed": ("speed", "training and search speed, SavedModel latency, memory; "
                       "--reference model_garden"),
    "training": ("training_speed", "training tokens/s of presets x precisions"),
    "savedmodel": ("savedmodel_speed", "a SavedModel's throughput and latency; "
                                       "--baseline compares two"),
    "profile-train": ("profile_train", "a training step's thread time by op kind"),
    "profile-search": ("profile_search", "an XLA beam search's time by thunk kind"),
    "working-set": ("decode_working_set", "a decoding step's matmuls against the weight "
                                          "bytes they read"),
    "ab": ("ab", "this checkout against another commit, in one process: speed and "
                 "whether the numbers are the same"),
    "fast-paths": ("fast_paths", "what each TensorFlow-only fast path gains on a "
                                 "training step"),
    "serve-load": ("serve_load", "kt-serve under load and faults, batching on and off"),
    "serve-engines": ("serve_engines", "kt-serve on the SavedModel and on CTranslate2: "
                                       "agreement, server overhead, load"),
    "model-card": ("model_card", "a shipped model's card figures for both engines: "
                                 "scores, latency, sentences/s, size"),
    "corpus": ("corpus", "kt-translate on a big file: memory at N and 10 N lines, "
                         "sentences/s against one window, resume after a kill"),
    "litert": ("litert", "a LiteRT export against the SavedModel: equality, int8 BLEU, "
                         "sizes, latency"),
    "serve-work": ("serve_work", "the memory one unit of kt-serve's request work costs "
                                 "on an export"),
    "search-quality": ("search_quality", "beam search vs exhaustive search, and Model Garden's"),
    "jax": ("jax_benchmark", "training and search speed with KERAS_BACKEND=jax, "
                             "no TensorFlow"),
    "ctranslate2": ("ctranslate2_speed", "the SavedModel beside CTranslate2 (float32, int8) "
                                         "on the same weights: throughput, latency"),
    "ctranslate2-bleu": ("ctranslate2_bleu", "BLEU of CTranslate2 exports vs the package's search"),
    "vocabulary-map": ("vocabulary_map", "CTranslate2 int8 with and without the vocabulary "
                                         "map: throughput and BLEU"),
    "demo-settings": ("demo_settings", "the demo's training length and checkpoint averaging "
                                       "on validation, over seeds"),
    "input-pipeline": ("input_pipeline", "CPU per update of the training input pipeline: "
                                         "tokenize-once vs subword sampling"),
    "model-garden-multi30k": ("model_garden_multi30k", "Model Garden trained and scored as "
                                                       "scripts/multi30k.sh trains ours"),
    "multi30k-jax": ("multi30k_jax", "Multi30k validation runs of the 2-hour recipe's model "
                                     "on an accelerator, KERAS_BACKEND=jax"),
}
# Subcommands that must not import TensorFlow.
WITHOUT_TENSORFLOW = {"jax"}


def usage():
    width = max(map(len, SUBCOMMANDS))
    lines = ["usage: python -m benchmarks <subcommand> [flags]", "",
             "subcommands (each takes --help):"]
    lines += [f"  {name:{width}}  {text}" for name, (_, text) in SUBCOMMANDS.items()]
    lines += ["", "The TensorFlow subcommands tune glibc's malloc as the kt-* commands do;",
              "KT_FAST_MALLOC=0 leaves it at its defaults."]
    return "\n".join(lines)


def apply_malloc_settings():
    """glibc's malloc tuned as the kt-* commands tune it, before TensorFlow
    is imported; KT_FAST_MALLOC=0 leaves it alone."""
    if os.environ.get("KT_FAST_MALLOC", "1") == "0":
        return
    # keras_transformer/malloc.py alone: importing it through the package
    # would run the package's __init__, which imports TensorFlow.
    package = importlib.util.find_spec("keras_transformer")
    path = os.path.join(package.submodule_search_locations[0], "malloc.py")
    spec = importlib.util.spec_from_file_location("keras_transformer_malloc", path)
    malloc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(malloc)
    malloc.apply()


def main(argv=None):
    from_shell = argv is None
    argv = list(sys.argv[1:] if from_shell else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"{usage()}\n\npython -m benchmarks: unknown subcommand {name!r}", file=sys.stderr)
        return 2
    if name in WITHOUT_TENSORFLOW:
        os.environ.setdefault("KERAS_BACKEND", "jax")  # fixed when Keras is imported
    else:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # read when TensorFlow loads
        apply_malloc_settings()
    module = importlib.import_module(f"benchmarks.{SUBCOMMANDS[name][0]}")
    if from_shell:
        # argparse names the program after sys.argv[0]; reports record sys.argv[1:].
        sys.argv = [f"python -m benchmarks {name}", *rest]
    module.main(rest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
