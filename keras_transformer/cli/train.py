"""kt-train: train the Transformer on a parallel corpus (data, vocabulary,
strategy, precision, model, checkpoints and `model.fit`, with exact resume).

The command is a thin layer over the library: its flags become a
`TrainingConfig` (keras_transformer/pipeline/settings.py, where every
setting's default and check live) and `keras_transformer.pipeline.trainer.
train` runs it. `main(argv)` parses the flags and returns the exit status.
"""

import argparse
import os
import sys

from keras_transformer import startup


def build_parser():
    from keras_transformer.config import PRESETS
    from keras_transformer.pipeline.settings import (
        DEFAULT_SUBWORD_NBEST,
        PRECISIONS,
        STRATEGIES,
        settings_fields,
    )

    p = argparse.ArgumentParser(
        prog="kt-train",
        description=(
            "Train the Transformer (paper section 5) on a parallel corpus. The first run "
            "trains (or takes) the subword vocabulary and writes RUN_DIR (config.json, "
            "vocab.model, train_args.json, checkpoints/, best/, logs/); running the same "
            "command again resumes exactly where the last checkpoint was (model, "
            "optimizer, step and position in the data)."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog=(
            "examples:\n"
            "  kt-train --run-dir runs/m30k --data text:$DATA \\\n"
            "      --src-lang en --tgt-lang de --config small --vocab-size 8000 "
            "--train-steps 20000\n"
            "  kt-train --run-dir runs/mine --train-tsv train.tsv --valid-tsv dev.tsv \\\n"
            "      --vocab my.model --config my.yaml --set dropout=0.2 "
            "--early-stopping-patience 5\n"
            "  kt-train --run-dir runs/wmt --data tfds:wmt14_translate/de-en \\\n"
            "      --src-lang en --tgt-lang de --config base --batch-tokens 3125 "
            "--accumulation-steps 8\n"
            "  kt-train --run-dir runs/tuned --init-from runs/wmt --train-src in.en "
            "--train-tgt in.de\n"
            "  TF_CONFIG='{\"cluster\":{\"worker\":[\"h1:2222\",\"h2:2222\"]},"
            "\"task\":{\"type\":\"worker\",\"index\":0}}' \\\n"
            "      kt-train --strategy multi_worker_mirrored ...  (same on h2 with index 1)\n"
            "  kt-average --run-dir runs/wmt --num 5\n"
            "\n"
            "SIGTERM (a preempted spot VM, a Kubernetes eviction) or Ctrl-C saves a checkpoint "
            "at the next update and exits 0; rerun the same command to resume exactly "
            "(docs/training.md, Preemptible machines)."
        ),
    )
    p.add_argument("--run-dir", required=True, help="run directory (created or resumed)")
    g = p.add_argument_group(
        "data", "Either --data (a named source) or files by path; per split, paths win.")
    g.add_argument("--data",
                   help="`text:<dir of <split>.<lang>[.gz]>`, `tfds:<name>/<config>`, or "
                        "`builtin` (the generated en <-> synth corpus)")
    g.add_argument("--src-lang",
                   help="source language suffix/feature, e.g. en (needed by --data)")
    g.add_argument("--tgt-lang",
                   help="target language suffix/feature, e.g. de (needed by --data)")
    g.add_argument("--train-split", help="split of --data to train on")
    g.add_argument("--valid-split",
                   help="split of --data to validate on; '' disables validation")
    g.add_argument("--test-split",
                   help="split of --data translated and scored at the end ('' : none)")
    for split, what in (("train", "training"), ("valid", "validation"), ("test", "test")):
        g.add_argument(f"--{split}-src",
                       help=f"{what} source sentences, one per line (plain or gzipped)")
        g.add_argument(f"--{split}-tgt",
                       help=f"{what} target sentences, aligned line by line with --{split}-src")
        g.add_argument(f"--{split}-tsv",
                       help=f"{what} pairs, one `source<TAB>target` per line (plain or gzipped)")
    g.add_argument("--max-length", type=int,
                   help="drop training pairs with a side longer than this many tokens "
                        "(counted, logged)")
    g.add_argument("--batch-tokens", type=int,
                   help="token budget per batch, per replica and side, padding included "
                        "(paper: ~25000 per step over 8 GPUs)")
    g.add_argument("--shuffle-buffer", type=int, help="pairs")
    g.add_argument("--cache-tokenized", action="store_true",
                   help="tokenize the training pairs once and keep their ids in memory "
                        "(saves the CPU that tokenizing every epoch takes; the ids of every "
                        "pair must fit in memory: fine for Multi30k, ~1.5 GB for WMT14)")
    g.add_argument("--input-autotune", choices=["on", "off"],
                   help="tf.data autotuning of the training stream (default on). Off "
                        "spares the wait of up to a minute that deleting an autotuned "
                        "iterator can cost when training ends: worth it for runs of minutes")
    g.add_argument("--subword-sampling", type=float, metavar="ALPHA",
                   help="subword regularization (Kudo 2018): each training pair's sides get "
                        "a segmentation drawn from their --subword-nbest most likely ones "
                        "with probability P^ALPHA, anew every epoch (0.1-0.5; unigram "
                        "vocabularies; the candidates are kept in memory). Validation, "
                        "BLEU and translation keep the best segmentation")
    g.add_argument("--subword-nbest", type=int, metavar="L",
                   help=f"candidates per sentence for --subword-sampling (default "
                        f"{DEFAULT_SUBWORD_NBEST})")
    g.add_argument("--seed", type=int,
                   help="weights, dropout and data order; a resumed run keeps its seed")
    g = p.add_argument_group("vocabulary")
    g.add_argument("--vocab",
                   help="an existing SentencePiece model to use as the shared vocabulary "
                        "(instead of training one)")
    g.add_argument("--src-vocab",
                   help="an existing SentencePiece model for the source side (with --tgt-vocab)")
    g.add_argument("--tgt-vocab",
                   help="an existing SentencePiece model for the target side (with --src-vocab)")
    g.add_argument("--separate-vocab", action="store_true",
                   help="train separate source and target vocabularies (default: one shared, "
                        "paper 3.4)")
    g.add_argument("--vocab-size", type=int,
                   help="pieces of a trained vocabulary (paper: 37000 shared for en-de)")
    g.add_argument("--src-vocab-size", type=int,
                   help="with --separate-vocab: source pieces (default --vocab-size)")
    g.add_argument("--tgt-vocab-size", type=int,
                   help="with --separate-vocab: target pieces (default --vocab-size)")
    g.add_argument("--vocab-model-type", choices=("unigram", "bpe"),
                   help="SentencePiece algorithm of a trained vocabulary")
    g.add_argument("--character-coverage", type=float,
                   help="share of characters a trained vocabulary covers (1.0 for "
                        "alphabetic scripts; ~0.9995 for Chinese or Japanese), the rest by "
                        "byte fallback")
    g.add_argument("--vocab-sentences", type=int,
                   help="training pairs read to train the vocabulary")
    g = p.add_argument_group("model")
    g.add_argument("--config", metavar="PRESET|FILE",
                   help=f"a Table 3 preset ({', '.join(sorted(PRESETS))}) or a YAML/JSON "
                        "file with `model:` (TransformerConfig fields, `preset`) and "
                        "`training:` (these flags) sections; flags given on the command "
                        "line win over the file (default: base, or the --init-from model's)")
    g.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one model field or training setting, over the file and "
                        "flags, e.g. --set norm_first=true --set training.batch_tokens=2048 "
                        "(repeatable; qualify with model./training. where a name is both)")
    g.add_argument("--dropout", type=float, help="override P_drop")
    g.add_argument("--r-drop", type=float, metavar="ALPHA",
                   help="R-Drop: each batch twice, with the symmetric KL between the two "
                        "passes' distributions weighted ALPHA added to the loss (about twice "
                        "the compute per update; 0: off, the default)")
    g.add_argument("--position-encoding",
                   choices=("sinusoidal", "learned", "none"),
                   help="override the positional encoding ('none': an ablation)")
    g.add_argument("--init-from", metavar="RUN_DIR|CHECKPOINT",
                   help="fine-tune: start a new run from a trained run's weights (its "
                        "averaged, best or last checkpoint, as kt-translate chooses) or from "
                        "a checkpoint prefix; same vocabulary and architecture, fresh "
                        "optimizer and schedule")
    g.add_argument("--keep-optimizer", action="store_true",
                   help="with --init-from a training checkpoint: also take its optimizer "
                        "slots and step (the schedule continues)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--train-steps", type=int,
                   help="total optimizer updates (paper: 100k base, 300k big)")
    g.add_argument("--max-minutes", type=float,
                   help="also stop after this much training wall time (validation included), "
                        "with a checkpoint, like fairseq's --stop-time-hours; one-process "
                        "strategies only")
    g.add_argument("--warmup-steps", type=int)
    g.add_argument("--lr-scale", type=float, help="multiplies the schedule")
    g.add_argument("--ema", type=float, metavar="DECAY",
                   help="keep an exponential moving average of the weights, "
                        "average = DECAY * average + (1 - DECAY) * weights after each "
                        "update, and validate, select best checkpoints and end with it "
                        "(e.g. 0.999; 0: off, the default)")
    g.add_argument("--accumulation-steps", type=int,
                   help="micro-batches per update (effective batch = batch-tokens x "
                        "replicas x this)")
    g.add_argument("--precision", choices=("auto",) + PRECISIONS,
                   help="auto: mixed_bfloat16 where the CPU or GPU multiplies bfloat16 in "
                        "hardware (AVX512-BF16/AMX CPUs, Ampere or later GPUs), else float32; "
                        "the choice is printed and recorded in train_args.json. "
                        "mixed_float16 adds dynamic loss scaling")
    g.add_argument("--strategy", choices=STRATEGIES,
                   help="default: mirrored with more than one GPU, else one_device")
    g.add_argument("--logical-cpus", type=int,
                   help="split the CPU into N devices for `mirrored` (testing without GPUs)")
    g.add_argument("--steps-per-execution", type=int)
    g.add_argument("--jit-compile", action="store_true",
                   help="compile the training and validation steps with XLA; batches are "
                        "then padded to their length bucket's longest length (one shape, "
                        "so one compilation, per bucket). Keras leaves XLA off under any "
                        "tf.distribute strategy, and so by default does this trainer "
                        "(docs/training.md: when it pays)")
    g = p.add_argument_group("validation, checkpoint selection and early stopping")
    g.add_argument("--validate-every", "--steps-per-epoch", dest="steps_per_epoch", type=int,
                   help="updates between validations (validation loss, and "
                   "BLEU with --bleu-sentences)")
    g.add_argument("--bleu-sentences", type=int,
                   help="validation sentences translated for BLEU (sacreBLEU) at every "
                        "validation; 0 disables")
    g.add_argument("--bleu-search", choices=("beam", "greedy"),
                   help="how validation sentences are translated (beam: 4, alpha 0.6)")
    g.add_argument("--best-metric", choices=("bleu", "loss"),
                   help="what chooses the best checkpoints (default: bleu when "
                        "--bleu-sentences > 0, else loss)")
    g.add_argument("--keep-best", type=int,
                   help="keep the best K checkpoints (model weights) in RUN_DIR/best/; "
                        "0 disables")
    g.add_argument("--early-stopping-patience", type=int,
                   help="stop after this many validations in a row without a new best")
    g = p.add_argument_group("checkpoints and logging")
    g.add_argument("--checkpoint-every", type=int, help="updates (0: only at the end)")
    g.add_argument("--keep-checkpoints", type=int,
                   help="keep the last K (average 5 for base, 20 for big)")
    g.add_argument("--log-every", type=int, help="TensorBoard interval in updates")
    g.add_argument("--verbose", type=int, choices=(0, 1, 2),
                   help="1: progress bar, 2: one line per epoch")
    g.add_argument("--wait-for-chief", type=float,
                   help="seconds a non-chief worker waits for the chief's vocabulary")
    startup.add_arguments(p)
    # Every setting's default is the TrainingConfig field's.
    p.set_defaults(**{name: field.default for name, field in settings_fields().items()})
    return p


def explicit_settings(parser, argv):
    """The settings whose flags appear in `argv` (they win over a file)."""
    strings = {o: a.dest for a in parser._actions for o in a.option_strings}
    return {strings[token.split("=", 1)[0]] for token in argv
            if token.split("=", 1)[0] in strings}


def training_config(args, argv=None, parser=None):
    """Parsed kt-train `args` -> a resolved `TrainingConfig`: the settings
    file of `--config` and `--set` applied with kt-train's precedence
    (flags in `argv` win over the file; without `argv`, flags at their
    default count as not given)."""
    from keras_transformer.pipeline.settings import TrainingConfig, resolve_settings

    parser = parser or build_parser()
    values = {name: getattr(args, name) for name in TrainingConfig.__dataclass_fields__
              if hasattr(args, name)}
    explicit = explicit_settings(parser, argv) if argv is not None else None
    return resolve_settings(TrainingConfig(**values), explicit, getattr(args, "set", ()))


def train(args, argv=None):
    """Runs kt-train on parsed `args` (see `training_config`); returns the
    trained `Transformer`."""
    from keras_transformer.pipeline.trainer import train as train_config

    return train_config(training_config(args, argv))


def main(argv=None):
    """kt-train. Returns the exit status (2: bad arguments or data, with the
    reason on stderr; KT_TRACEBACK=1 raises)."""
    startup.start(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    try:
        train(args, argv=argv)
    except (ValueError, FileNotFoundError, TimeoutError) as e:
        if os.environ.get("KT_TRACEBACK"):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
