"""The Quick start's main job, end to end on the built-in corpus (offline):

  1. generate the built-in English -> synthetic-language corpus and train a
     shared subword vocabulary on it;
  2. train the `demo` Transformer with `model.fit` (progress bar), with
     checkpoints in the run directory;
  3. average the last checkpoints (paper 6.1);
  4. translate the held-out test split with beam search (beam 4, alpha 0.6)
     and score it with sacreBLEU;
  5. export a SavedModel (strings in, strings out) to saved_models/, load it
     back with `tf.saved_model.load` and translate held-out sentences;
  6. draw the attention maps of one translation (skipped, saying so, without
     matplotlib: `pip install 'attention-transformer-keras[viz]'`).

    kt-demo                                  # a few minutes on 2 CPU cores
    kt-demo --train-steps 200 --config tiny  # a smoke run

docs/performance.md has measured times. The run directory and the
SavedModels go under the current directory unless --run-dir and
--saved-models say otherwise.
"""

import argparse
import os
import shlex
import shutil
import sys
import time

from keras_transformer import startup

# Held-out sentences the SavedModel carries as examples.
EXAMPLES = 12


def build_parser():
    p = argparse.ArgumentParser(allow_abbrev=False, prog="kt-demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", default=os.path.join("runs", "demo"),
                   help="run directory (default: %(default)s)")
    p.add_argument("--saved-models", default="saved_models",
                   help="where <name>/<version>/ is exported (default: %(default)s)")
    p.add_argument("--name", default="demo", help="model name under saved_models/")
    p.add_argument("--config", default="demo")
    p.add_argument("--train-steps", type=int, default=1400)
    p.add_argument("--batch-tokens", type=int, default=2000)
    p.add_argument("--precision", default="float32",
                   choices=["float32", "mixed_bfloat16", "mixed_float16"])
    p.add_argument("--dropout", type=float, default=None,
                   help="override the preset's P_drop")
    p.add_argument("--average", type=int, default=5, help="checkpoints to average")
    p.add_argument("--seed", type=int, default=1,
                   help="initialisation and data-order seed (kt-train --seed); the run is "
                        "deterministic for a seed on a given machine")
    p.add_argument("--position-encoding", default="sinusoidal",
                   choices=["sinusoidal", "learned", "none"],
                   help="'none' is the control: without positions the task cannot be learned")
    p.add_argument("--test-sentences", type=int, default=500,
                   help="held-out sentences to translate and score")
    p.add_argument("--fresh", action="store_true",
                   help="delete an existing run directory first (default: resume it)")
    startup.add_arguments(p)
    return p


def training_arguments(args, keep_checkpoints=None, checkpoint_every=None, warmup_steps=None,
                       verbose=1):
    """kt-train's arguments for the demo's run on the built-in corpus, from
    kt-demo's parsed `args` (`build_parser()`).

    `keep_checkpoints` defaults to the `--average` count. `checkpoint_every`
    defaults to a fourteenth of the run (100 updates at 1,400): the model
    still improves fast at the end, so the averaged checkpoints are the last
    few, close together (docs/experiments.md, "The demo's settings").
    `warmup_steps` defaults to min(400, train_steps // 3). `python -m
    benchmarks demo-settings` trains with these too.
    """
    train_steps = args.train_steps
    if keep_checkpoints is None:
        keep_checkpoints = max(args.average, 1)
    if checkpoint_every is None:
        checkpoint_every = max(1, train_steps // 14)
    if warmup_steps is None:
        warmup_steps = max(1, min(400, train_steps // 3))
    return [
        "--run-dir", args.run_dir, "--data", "builtin", "--src-lang", "en",
        "--tgt-lang", "synth", "--config", args.config, "--vocab-size", "3000",
        "--vocab-model-type", "bpe", "--max-length", "64",
        "--batch-tokens", str(args.batch_tokens), "--train-steps", str(train_steps),
        "--warmup-steps", str(warmup_steps), "--lr-scale", "1.5",
        "--precision", args.precision, "--checkpoint-every", str(checkpoint_every),
        "--keep-checkpoints", str(keep_checkpoints),
        "--steps-per-epoch", str(max(1, min(100, train_steps // 6))),
        "--valid-split", "validation",
        "--bleu-sentences", "0", "--shuffle-buffer", "40000", "--verbose", str(verbose),
        # Several passes over 40k pairs: tokenize once (same batches, same
        # weights, less CPU per pass).
        "--cache-tokenized",
        # A run of minutes: no wait for the autotuning thread when fit ends.
        "--input-autotune", "off",
        "--position-encoding", args.position_encoding, "--seed", str(args.seed),
        *(["--dropout", str(args.dropout)] if args.dropout is not None else []),
    ]


class PhaseClock:
    """Prints each phase's header and, at the next one, how long it took."""

    def __init__(self):
        self.started = self.phase_started = time.time()
        self.name = None

    def phase(self, title):
        self.stop()
        print(f"\n== {title}", flush=True)
        self.name, self.phase_started = title, time.time()

    def stop(self):
        if self.name is not None:
            print(f"   ({time.time() - self.phase_started:.0f} s)", flush=True)
            self.name = None

    def minutes(self):
        return (time.time() - self.started) / 60


def draw_pictures(run_dir, sentence, checkpoint):
    """Phase 6: the attention maps of `sentence` translated by `checkpoint`,
    in `<run_dir>/pictures`. Returns that directory; or, when matplotlib (the
    `viz` extra) is missing, prints one line saying so and how to draw them
    later, and returns None, so that the demo still ends well."""
    from keras_transformer.cli.visualize import visualize
    from keras_transformer.visualization import matplotlib_missing

    missing = matplotlib_missing()
    if missing:
        print(f"Skipped: {missing}, then kt-visualize --run-dir {shlex.quote(run_dir)} "
              f"--sentence {shlex.quote(sentence)}", flush=True)
        return None
    pictures_dir = os.path.join(run_dir, "pictures")
    visualize(run_dir, sentence, pictures_dir, checkpoint=checkpoint)
    return pictures_dir


def main(argv=None):
    startup.start(argv)
    args = build_parser().parse_args(argv)
    import tensorflow as tf

    from keras_transformer.cli import train
    from keras_transformer.data.synthetic import builtin_source
    from keras_transformer.evaluation import score_translations
    from keras_transformer.export.engine import SERVING_DEFAULT
    from keras_transformer.export.saved_model import export_translator
    from keras_transformer.export.translator import Translator
    from keras_transformer.run_directory import RunDirectory
    from keras_transformer.training.checkpoints import average_checkpoints

    clock = PhaseClock()
    if args.fresh and os.path.isdir(args.run_dir):
        shutil.rmtree(args.run_dir)
    clock.phase("1-2. Vocabulary and training on the built-in corpus")
    status = train.main(training_arguments(args))
    if status:
        return status
    run = RunDirectory(args.run_dir)

    clock.phase(f"3. Averaging the last {args.average} checkpoints")
    averaged, inputs = average_checkpoints(run, args.average)
    print(f"averaged {len(inputs)} checkpoints into {averaged}")

    clock.phase("4. Beam search (beam 4, alpha 0.6, XLA) on the held-out test split")
    tokenizer = run.load_tokenizer()
    translator = Translator(run.load_model(averaged), tokenizer)
    test = list(builtin_source("", "test", "en", "synth").take(args.test_sentences)
                .as_numpy_iterator())
    sources = [s.decode() for s, _ in test]
    references = [t.decode() for _, t in test]
    hypotheses, _ = translator.translate(sources, jit_compile=True)
    scores = score_translations(hypotheses, references)
    print(scores["bleu_text"])
    print(scores["chrf_text"])

    clock.phase("5. Exporting the SavedModel and loading it back")
    # Held-out sentences ride along for kt-serve's playground to offer.
    path = export_translator(translator, args.saved_models, name=args.name,
                             examples=sources[:EXAMPLES])
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops for loading)

    served = tf.saved_model.load(path).signatures[SERVING_DEFAULT]
    samples = sources[:5]
    outputs = served(text=tf.constant(samples))
    for source, translation, reference in zip(
            samples, outputs["translation"].numpy(), references[:5]):
        translation = translation.decode("utf-8")
        mark = "ok " if translation == reference else "   "
        print(f"{mark}{source}\n   -> {translation}\n   (reference: {reference})")

    clock.phase("6. Attention pictures")
    pictures_dir = draw_pictures(args.run_dir, sources[0], averaged)

    clock.stop()
    minutes = clock.minutes()
    print(f"\nDone in {minutes:.1f} minutes.")
    print(f"  test BLEU       {scores['bleu']:.1f} (sacreBLEU, {len(sources)} held-out sentences)")
    print(f"  run directory   {run.path}  (config, vocabulary, checkpoints, TensorBoard logs)")
    print(f"  SavedModel      {path}")
    if pictures_dir:
        print(f"  pictures        {pictures_dir}")
    print(f"  TensorBoard     tensorboard --logdir {run.log_dir}")
    print(f"  translate more  echo 'the dog sees a cat' | kt-translate "
          f"--saved-model {os.path.dirname(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
