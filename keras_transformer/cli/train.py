"""kt-train: train the Transformer on a parallel corpus (data, vocabulary,
strategy, precision, model, checkpoints and `model.fit`, with exact resume).

`train(args)` is the command as a function of its parsed arguments;
`main(argv)` parses them and returns the exit status."""

import argparse
import hashlib
import math
import os
import sys
import time
import warnings

from keras_transformer import startup

# Arguments that must not change when a run is resumed.
FIXED_ON_RESUME = ("data", "src_lang", "tgt_lang", "config", "vocab_size",
                   "position_encoding")


def build_parser():
    from keras_transformer.config import PRESETS
    from keras_transformer.training.strategy import PRECISIONS, STRATEGIES

    p = argparse.ArgumentParser(
        prog="kt-train",
        description=(
            "Train the Transformer (paper section 5) on a parallel corpus. The first run "
            "trains a shared subword vocabulary and writes RUN_DIR (config.json, "
            "vocab.model, train_args.json, checkpoints/, logs/); running the same command "
            "again resumes from the latest checkpoint (model, optimizer slots, step)."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog=(
            "examples:\n"
            "  kt-train --run-dir runs/m30k --data text:../shared/data/multi30k \\\n"
            "      --src-lang en --tgt-lang de --config small --vocab-size 8000 --train-steps 20000\n"
            "  kt-train --run-dir runs/wmt --data tfds:wmt14_translate/de-en \\\n"
            "      --src-lang en --tgt-lang de --config base --batch-tokens 3125 --accumulation-steps 8\n"
            "  TF_CONFIG='{\"cluster\":{\"worker\":[\"h1:2222\",\"h2:2222\"]},\"task\":{\"type\":\"worker\",\"index\":0}}' \\\n"
            "      kt-train --strategy multi_worker_mirrored ...  (same on h2 with index 1)\n"
            "  kt-average --run-dir runs/wmt --num 5"
        ),
    )
    g = p.add_argument_group("data")
    g.add_argument("--run-dir", required=True, help="run directory (created or resumed)")
    g.add_argument("--data", required=True,
                   help="`text:<dir of <split>.<lang>[.gz]>`, `tfds:<name>/<config>`, or "
                        "`builtin` (the generated en <-> synth corpus)")
    g.add_argument("--src-lang", required=True, help="source language suffix/feature, e.g. en")
    g.add_argument("--tgt-lang", required=True, help="target language suffix/feature, e.g. de")
    g.add_argument("--train-split", default="train")
    g.add_argument("--valid-split", default="validation", help="'' disables validation")
    g.add_argument("--max-length", type=int, default=256,
                   help="drop pairs with a side longer than this many tokens (counted, logged)")
    g.add_argument("--batch-tokens", type=int, default=4096,
                   help="token budget per batch, per replica and side, padding included "
                        "(paper: ~25000 per step over 8 GPUs)")
    g.add_argument("--shuffle-buffer", type=int, default=100_000, help="pairs")
    g.add_argument("--cache-tokenized", action="store_true",
                   help="tokenize the training pairs once and keep their ids in memory "
                        "(saves the CPU that tokenizing every epoch takes; the ids of every "
                        "pair must fit in memory: fine for Multi30k, ~1.5 GB for WMT14)")
    g.add_argument("--seed", type=int, default=1)
    g = p.add_argument_group("vocabulary and model")
    g.add_argument("--config", default="base", choices=sorted(PRESETS),
                   help="Table 3 preset")
    g.add_argument("--vocab-size", type=int, default=37000,
                   help="shared SentencePiece vocabulary (paper: 37000 for en-de)")
    g.add_argument("--vocab-model-type", default="unigram", choices=("unigram", "bpe"),
                   help="SentencePiece algorithm of the shared vocabulary")
    g.add_argument("--vocab-sentences", type=int, default=1_000_000,
                   help="training pairs read to train the vocabulary")
    g.add_argument("--dropout", type=float, default=None, help="override P_drop")
    g.add_argument("--position-encoding", default=None,
                   choices=("sinusoidal", "learned", "none"),
                   help="override the positional encoding ('none': an ablation)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--train-steps", type=int, default=100_000,
                   help="total optimizer updates (paper: 100k base, 300k big)")
    g.add_argument("--max-minutes", type=float, default=None,
                   help="also stop after this much training wall time (validation included), "
                        "with a checkpoint, like fairseq's --stop-time-hours; one-process "
                        "strategies only")
    g.add_argument("--warmup-steps", type=int, default=4000)
    g.add_argument("--lr-scale", type=float, default=1.0, help="multiplies the schedule")
    g.add_argument("--accumulation-steps", type=int, default=1,
                   help="micro-batches per update (effective batch = batch-tokens x replicas x this)")
    g.add_argument("--precision", default="float32", choices=PRECISIONS,
                   help="mixed_float16 adds dynamic loss scaling")
    g.add_argument("--strategy", default=None, choices=STRATEGIES,
                   help="default: mirrored with more than one GPU, else one_device")
    g.add_argument("--logical-cpus", type=int, default=0,
                   help="split the CPU into N devices for `mirrored` (testing without GPUs)")
    g.add_argument("--steps-per-execution", type=int, default=1)
    g.add_argument("--jit-compile", action="store_true",
                   help="compile the training and validation steps with XLA; batches are "
                        "then padded to their length bucket's longest length (one shape, "
                        "so one compilation, per bucket). Keras leaves XLA off under any "
                        "tf.distribute strategy, and so by default does this trainer "
                        "(docs/training.md: when it pays)")
    g = p.add_argument_group("checkpoints and logging")
    g.add_argument("--checkpoint-every", type=int, default=1000, help="updates (0: only at the end)")
    g.add_argument("--keep-checkpoints", type=int, default=20,
                   help="keep the last K (average 5 for base, 20 for big)")
    g.add_argument("--steps-per-epoch", type=int, default=1000,
                   help="updates between validation runs")
    g.add_argument("--bleu-sentences", type=int, default=200,
                   help="validation sentences translated (beam search) for BLEU at the end "
                        "of every epoch; 0 disables")
    g.add_argument("--log-every", type=int, default=100, help="TensorBoard interval in updates")
    g.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2),
                   help="1: progress bar, 2: one line per epoch")
    g.add_argument("--wait-for-chief", type=float, default=600,
                   help="seconds a non-chief worker waits for the chief's vocabulary")
    startup.add_arguments(p)
    return p


# Keras 3 compiles a replica's step with the variables of every replica in
# it; TensorFlow then refuses to read another device's variable ("Trying to
# access resource ... located in device ...CPU:1 from device ...CPU:0").
_JIT_WITH_REPLICAS = ("--jit-compile needs one device; the {} strategy runs replicas, whose "
                      "steps Keras 3 cannot compile with XLA. Drop --jit-compile, or use "
                      "--strategy one_device.")


def validate_args(args):
    positive = ("max_length", "batch_tokens", "vocab_size", "vocab_sentences", "train_steps",
                "warmup_steps", "accumulation_steps", "steps_per_execution", "keep_checkpoints",
                "steps_per_epoch", "log_every")
    for name in positive:
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, received "
                             f"{getattr(args, name)}.")
    if args.batch_tokens < args.max_length:
        raise ValueError(f"--batch-tokens ({args.batch_tokens}) must be at least --max-length "
                         f"({args.max_length}).")
    if args.strategy == "multi_worker_mirrored" and args.logical_cpus > 1:
        raise ValueError("--logical-cpus applies to --strategy mirrored only.")
    if args.jit_compile and args.strategy in ("mirrored", "multi_worker_mirrored"):
        raise ValueError(_JIT_WITH_REPLICAS.format(args.strategy))
    if args.max_minutes is not None:
        if args.max_minutes <= 0:
            raise ValueError(f"--max-minutes must be positive, received {args.max_minutes}.")
        if args.strategy == "multi_worker_mirrored":
            # Workers' clocks would stop them at different steps, and the
            # others would wait forever in the next all-reduce.
            raise ValueError("--max-minutes cannot be used with multi_worker_mirrored: "
                             "workers could stop at different steps; use --train-steps.")


def weights_digest(model):
    """sha256 over every weight's bytes: equal digests, equal models."""
    import keras
    import numpy as np

    h = hashlib.sha256()
    for v in model.weights:
        h.update(np.ascontiguousarray(keras.ops.convert_to_numpy(v)).tobytes())
    return h.hexdigest()


def _prepare_run_directory(args, run, strategy, load_pairs):
    """Returns `(config, tokenizer)`: from the run directory when it exists;
    otherwise the chief trains the vocabulary and writes config and
    vocabulary, and other workers wait for them."""
    from keras_transformer.config import get_config
    from keras_transformer.data.sources import sentences_for_vocabulary
    from keras_transformer.tokenizer import SubwordTokenizer, train_sentencepiece
    from keras_transformer.training.strategy import is_chief

    if run.exists():
        previous = run.load_args()
        changed = {k: (previous[k], getattr(args, k)) for k in FIXED_ON_RESUME
                   if k in previous and previous[k] != getattr(args, k)}
        if changed:
            raise ValueError(
                f"{run.path} was created with different settings {changed} "
                "(was, now); use a new --run-dir or the original arguments."
            )
        return run.load_config(), run.load_tokenizer()
    if is_chief(strategy):
        print(f"Training a {args.vocab_size}-piece shared vocabulary on up to "
              f"{args.vocab_sentences} pairs of {args.data} ...", flush=True)
        pairs = load_pairs(args.train_split)
        proto = train_sentencepiece(
            sentences_for_vocabulary(pairs, args.vocab_sentences), args.vocab_size,
            model_type=args.vocab_model_type)
        tokenizer = SubwordTokenizer(proto)
        overrides = {} if args.dropout is None else {"dropout": args.dropout}
        if args.position_encoding is not None:
            overrides["position_encoding"] = args.position_encoding
        config = get_config(
            args.config, vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id,
            bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id,
            warmup_steps=args.warmup_steps, **overrides)
        os.makedirs(run.path, exist_ok=True)
        run.save_args(vars(args))
        run.save_tokenizer(tokenizer)
        run.save_config(config)  # last: `run.exists()` means complete.
        return config, tokenizer
    deadline = time.time() + args.wait_for_chief
    while not run.exists():
        if time.time() > deadline:
            raise TimeoutError(
                f"Waited {args.wait_for_chief}s for the chief to write {run.path}; is the run "
                "directory on a file system shared by all workers?")
        time.sleep(0.5)
    time.sleep(0.5)
    return run.load_config(), run.load_tokenizer()


def train(args, translate_fn_factory=None, extra_callbacks=()):
    """Runs training as `kt-train` does.

    Args:
        args: parsed `build_parser()` arguments.
        translate_fn_factory: optional `(model, tokenizer) -> translate_fn`,
            where `translate_fn(list of str) -> list of str`; with it, BLEU on
            up to 500 validation sentences is logged every `--steps-per-epoch`.
        extra_callbacks: more Keras callbacks.

    Returns: the trained `Transformer`.
    """
    validate_args(args)
    from keras_transformer.training.strategy import make_strategy

    # The strategy first: MultiWorkerMirroredStrategy and logical CPUs need
    # TensorFlow uninitialised.
    strategy = make_strategy(args.strategy, args.logical_cpus)
    if args.jit_compile and strategy.num_replicas_in_sync > 1:
        raise ValueError(_JIT_WITH_REPLICAS.format(type(strategy).__name__))

    import keras

    from keras_transformer.data import batching
    from keras_transformer.data.sources import load_pairs
    from keras_transformer.losses import LabelSmoothedCrossEntropy
    from keras_transformer.metrics import MaskedAccuracy
    from keras_transformer.run_directory import RunDirectory
    from keras_transformer.schedules import transformer_adam
    from keras_transformer.training import callbacks as cb
    from keras_transformer.training.checkpoints import (
        CheckpointWriter, StepCheckpoint, build_for_restore, optimizer_step)
    from keras_transformer.training.strategy import is_chief, set_precision
    from keras_transformer.transformer import Transformer

    # Seed before creating the tokenizer: seeding destroys eager resources.
    keras.utils.set_random_seed(args.seed)
    set_precision(args.precision)
    chief = is_chief(strategy)
    run = RunDirectory(args.run_dir)

    def pairs_of(split):
        return load_pairs(args.data, split, args.src_lang, args.tgt_lang)

    config, tokenizer = _prepare_run_directory(args, run, strategy, pairs_of)
    replicas = strategy.num_replicas_in_sync
    if chief:
        print(f"Strategy {type(strategy).__name__} with {replicas} replica(s); precision "
              f"{args.precision}; {args.batch_tokens} tokens per replica batch x {replicas} "
              f"replicas x {args.accumulation_steps} accumulation = "
              f"{args.batch_tokens * replicas * args.accumulation_steps} tokens per update "
              "(upper bound, padding included).", flush=True)

    with strategy.scope():
        model = Transformer(config)
        optimizer = transformer_adam(
            config.d_model, warmup_steps=config.warmup_steps, scale=args.lr_scale,
            gradient_accumulation_steps=(args.accumulation_steps
                                         if args.accumulation_steps > 1 else None))
        if args.accumulation_steps > 1:
            optimizer.learning_rate = cb.PerUpdateSchedule(
                optimizer._learning_rate, args.accumulation_steps)
        if args.precision == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        model.compile(
            optimizer=optimizer,
            loss=LabelSmoothedCrossEntropy(config.label_smoothing, pad_id=config.pad_id),
            metrics=[MaskedAccuracy(pad_id=config.pad_id), cb.TargetTokens(config.pad_id)],
            steps_per_execution=args.steps_per_execution,
            jit_compile=args.jit_compile,
        )
        # Logged values are already global (synchronised metric variables;
        # see Transformer.compute_loss): take the first replica's. Keras's
        # default ("mean") fails under MultiWorkerMirroredStrategy.
        model.distribute_reduction_method = "first"
        build_for_restore(model, optimizer)
        writer = CheckpointWriter(model, optimizer, run.checkpoint_dir,
                                  max_to_keep=args.keep_checkpoints, strategy=strategy)
        restored = writer.restore_latest()
    start_step = optimizer_step(optimizer)
    if restored:
        lr = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
        print(f"Resumed from {restored} at step {start_step}; learning rate {lr!r}", flush=True)
    if start_step >= args.train_steps:
        print(f"Already at step {start_step} >= --train-steps {args.train_steps}; nothing to do.")
        return model

    # Data: every replica gets its own token-bucketed batch.
    length_filter = batching.LengthFilter(args.max_length)

    def train_fn(context):
        pairs = pairs_of(args.train_split).shard(
            context.num_input_pipelines, context.input_pipeline_id)
        return batching.token_batches(
            pairs, tokenizer, args.batch_tokens, args.max_length, length_filter,
            shuffle_buffer=args.shuffle_buffer, seed=args.seed + start_step, repeat=True,
            cache_tokenized=args.cache_tokenized, fixed_shapes=args.jit_compile)

    train_ds = batching.distributed_dataset(strategy, train_fn)
    val_ds = None
    if args.valid_split:
        val_filter = batching.LengthFilter(args.max_length)

        def val_fn(context):
            pairs = pairs_of(args.valid_split).shard(
                context.num_input_pipelines, context.input_pipeline_id)
            return batching.token_batches(pairs, tokenizer, args.batch_tokens,
                                          args.max_length, val_filter,
                                          fixed_shapes=args.jit_compile)

        val_ds = batching.distributed_dataset(strategy, val_fn)

    callbacks = [
        cb.StopAtStep(args.train_steps),
        *([cb.StopAfterTime(args.max_minutes * 60)] if args.max_minutes else []),
        StepCheckpoint(writer, args.checkpoint_every),
        cb.TrainingLogger(run.log_dir if chief else None, args.log_every, length_filter),
        *extra_callbacks,
    ]
    if translate_fn_factory is not None and args.valid_split and chief:
        pairs = list(pairs_of(args.valid_split).take(args.bleu_sentences).as_numpy_iterator())
        callbacks.append(cb.TranslationEvaluation(
            translate_fn_factory(model, tokenizer), [s.decode() for s, _ in pairs],
            [t.decode() for _, t in pairs], args.steps_per_epoch, run.log_dir))

    initial_epoch = start_step // args.steps_per_epoch
    epochs = initial_epoch + math.ceil((args.train_steps - start_step) / args.steps_per_epoch)
    with warnings.catch_warnings():
        # The training data repeats forever (callbacks stop the run), so it
        # cannot run out; the validation set has no known length, and Keras
        # (3.15) warns "Your input ran out of data; interrupting training" when
        # its first pass ends, which is how it learns that length. A false
        # alarm, fixed upstream in keras-team/keras#23360.
        warnings.filterwarnings("ignore", message="Your input ran out of data")
        model.fit(
            train_ds,
            validation_data=val_ds,
            steps_per_epoch=args.steps_per_epoch * args.accumulation_steps,
            initial_epoch=initial_epoch,
            epochs=epochs,
            callbacks=callbacks,
            verbose=args.verbose if chief else 0,
            shuffle=False,  # the pipeline shuffles (--shuffle-buffer)
        )
    counts = length_filter.counts()
    print(f"Training finished at step {optimizer_step(optimizer)}; weights sha256 "
          f"{weights_digest(model)}; training pairs dropped for length: {counts['dropped']} "
          f"of {counts['kept'] + counts['dropped']} read.", flush=True)
    return model


def beam_search_bleu_factory(model, tokenizer):
    """`translate_fn` for the periodic BLEU: beam search with the paper's
    settings over the model being trained."""
    from keras_transformer.export.translator import Translator

    translator = Translator(model, tokenizer)
    return lambda sentences: translator.translate(sentences)[0]


def main(argv=None, **kwargs):
    """kt-train; `kwargs` go to `train`. Returns the exit status (2: bad
    arguments or data, with the reason on stderr; KT_TRACEBACK=1 raises)."""
    startup.start(argv)
    args = build_parser().parse_args(argv)
    if args.bleu_sentences and "translate_fn_factory" not in kwargs:
        kwargs["translate_fn_factory"] = beam_search_bleu_factory
    try:
        train(args, **kwargs)
    except (ValueError, FileNotFoundError, TimeoutError) as e:
        if os.environ.get("KT_TRACEBACK"):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
