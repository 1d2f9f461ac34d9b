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


def build_parser(argument_default=None):
    """kt-train's parser: `--run-dir`, `--config`, `--set`, the start-up
    flags, and one flag per `TrainingConfig` setting, generated from the
    field's metadata (flag, help, group, choices; defaults the field's).
    `argument_default=argparse.SUPPRESS`: no defaults, so that a parse
    holds only the flags given (`explicit_settings`)."""
    from keras_transformer.config import PRESETS
    from keras_transformer.pipeline.settings import (
        GROUP_NOTES,
        MODEL,
        settings_fields,
    )

    suppress = argument_default is argparse.SUPPRESS
    p = argparse.ArgumentParser(
        prog="kt-train",
        description=(
            "Train the Transformer (paper section 5) on a parallel corpus. The first run "
            "trains (or takes) the subword vocabulary and writes RUN_DIR (config.json, "
            "vocab.model, train_args.json, checkpoints/, best/, logs/); running the same "
            "command again resumes exactly where the last checkpoint was (model, "
            "optimizer, step and position in the data). Every setting is listed, with "
            "its type, default and range, in docs/configuration.md."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,
        argument_default=argument_default,
        epilog=EPILOG,
    )
    p.add_argument("--run-dir", required=True, help="run directory (created or resumed)")
    groups = {}
    for name, field in settings_fields().items():
        meta = field.metadata
        group = groups.get(meta["group"])
        if group is None:
            group = groups[meta["group"]] = p.add_argument_group(
                meta["group"], GROUP_NOTES.get(meta["group"]))
            if meta["group"] == MODEL:
                _model_file_flags(group, PRESETS, suppress)
        flags = [meta["flag"] or "--" + name.replace("_", "-"), *meta["aliases"]]
        if meta["kind"] is bool:
            group.add_argument(*flags, dest=name, action="store_true", help=meta["help"])
        else:
            group.add_argument(*flags, dest=name, type=meta["kind"], choices=meta["choices"],
                               metavar=meta["metavar"], help=meta["help"])
    startup.add_arguments(p)
    if not suppress:
        p.set_defaults(**{name: field.default for name, field in settings_fields().items()})
    return p


def _model_file_flags(group, presets, suppress):
    """`--config` and `--set`, which are not settings of their own."""
    group.add_argument("--config", metavar="PRESET|FILE",
                       help=f"a Table 3 preset ({', '.join(sorted(presets))}) or a YAML/JSON "
                            "file with `model:` (TransformerConfig fields, `preset`) and "
                            "`training:` (these flags) sections; flags given on the command "
                            "line win over the file (default: base, or the --init-from "
                            "model's)")
    group.add_argument("--set", action="append", metavar="KEY=VALUE",
                       **({} if suppress else {"default": []}),
                       help="override one model field or training setting, over the file "
                            "and flags, e.g. --set norm_first=true --set "
                            "training.batch_tokens=2048 (repeatable; qualify with "
                            "model./training. where a name is both)")


EPILOG = (
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
)


def explicit_settings(argv):
    """The settings whose flags appear in `argv` (they win over a file): a
    parse without defaults holds only those. Flags are never abbreviated
    (`allow_abbrev=False`), so every spelling that parses is counted."""
    from keras_transformer.pipeline.settings import settings_fields

    given = vars(build_parser(argparse.SUPPRESS).parse_args(argv))
    return set(given) & set(settings_fields())


def training_config(args, argv=None):
    """Parsed kt-train `args` -> a resolved `TrainingConfig`: the settings
    file of `--config` and `--set` applied with kt-train's precedence
    (flags in `argv` win over the file; without `argv`, flags at their
    default count as not given)."""
    from keras_transformer.pipeline.settings import TrainingConfig, resolve_settings

    values = {name: getattr(args, name) for name in TrainingConfig.__dataclass_fields__
              if hasattr(args, name)}
    explicit = explicit_settings(argv) if argv is not None else None
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
