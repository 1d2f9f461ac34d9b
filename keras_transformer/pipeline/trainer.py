"""`train(config)`: what `kt-train` runs, as a library function.

    data (`Corpus`) -> vocabulary (given, fine-tuned from, or trained)
      -> `TransformerConfig` -> the run directory (created, or checked
         against the settings it was created with)
      -> strategy, precision, model, optimizer -> `TrainingRun` (exact
         resume) or `init_from` weights -> token-bucketed pipelines
      -> `model.fit` with checkpoints, validation (loss, BLEU), the best
         checkpoints and early stopping
      -> the checkpoint to ship, scored on the test split when there is one.
"""

import copy
import math
import os
import time
import warnings

from keras_transformer.config import is_settings_file
from keras_transformer.pipeline.corpus import Corpus
from keras_transformer.pipeline.settings import (
    JIT_WITH_REPLICAS,
    has_validation,
    model_config,
    resolve_settings,
    validate,
)
from keras_transformer.pipeline.vocabulary import subword_sampling, vocabularies

# Settings that must not change when a run is resumed: the data, the
# vocabulary and the model.
FIXED_ON_RESUME = ("data", "src_lang", "tgt_lang", "config", "vocab_size", "position_encoding",
                   "train_src", "train_tgt", "train_tsv", "vocab", "src_vocab", "tgt_vocab",
                   "separate_vocab", "src_vocab_size", "tgt_vocab_size", "init_from")
# Settings that decide the stream of training batches: a resumed run
# continues the uninterrupted run's stream only if they are unchanged.
DATA_STREAM = ("seed", "batch_tokens", "max_length", "shuffle_buffer", "accumulation_steps",
               "cache_tokenized", "jit_compile", "strategy", "logical_cpus", "train_split",
               "subword_sampling", "subword_nbest")
# Fields an init_from model may change: regularisation and schedule.
FINE_TUNABLE = ("dropout", "attention_dropout", "activation_dropout", "label_smoothing",
                "r_drop", "warmup_steps")
# Test sets at least this long are translated with the XLA-compiled search.
XLA_TEST_SET_SENTENCES = 256


def train(config, callbacks=()):
    """Trains as `kt-train` does; rerun with the same `config` to resume.

    Args:
        config: a `TrainingConfig` (a settings file it names is read here
            unless `resolve_settings` already read it).
        callbacks: more Keras callbacks, run after the run's own.

    Returns: the trained `Transformer`.

    Raises `ValueError` naming the setting, file or line for bad settings
    or data.

    Example:

    ```python
    import tempfile

    import keras_transformer as kt

    model = kt.train(kt.TrainingConfig(
        run_dir=tempfile.mkdtemp(), data="builtin:train=200,val=20,test=0",
        src_lang="en", tgt_lang="synth", config="tiny", vocab_size=400,
        train_steps=4, steps_per_epoch=2, batch_tokens=256, max_length=32,
        bleu_sentences=0, keep_best=0, verbose=0))
    assert int(model.optimizer.iterations.numpy()) == 4
    ```
    """
    if config.config is not None and config.config_file is None \
            and is_settings_file(config.config):
        config = resolve_settings(config)
    config = copy.copy(config)
    validate(config)
    from keras_transformer.training.strategy import describe, make_strategy

    # The strategy first: MultiWorkerMirroredStrategy and logical CPUs need
    # TensorFlow uninitialised.
    strategy = make_strategy(config.strategy, config.logical_cpus)
    if config.jit_compile and strategy.num_replicas_in_sync > 1:
        raise ValueError(JIT_WITH_REPLICAS.format(describe(strategy)))

    import keras

    from keras_transformer.data import batching
    from keras_transformer.losses import LabelSmoothedCrossEntropy
    from keras_transformer.metrics import MaskedAccuracy
    from keras_transformer.run_directory import RunDirectory
    from keras_transformer.schedules import transformer_adam
    from keras_transformer.training import callbacks as cb
    from keras_transformer.training.checkpoints import optimizer_step
    from keras_transformer.training.run import TrainingRun, weights_digest
    from keras_transformer.training.strategy import choose_precision, is_chief, set_precision
    from keras_transformer.transformer import Transformer

    corpus = Corpus(config)
    # Seed before creating the tokenizer: seeding destroys eager resources.
    keras.utils.set_random_seed(config.seed)
    # Resolved before the run directory records the settings.
    config.precision, precision_reason = choose_precision(config.precision)
    set_precision(config.precision)
    chief = is_chief(strategy)
    run = RunDirectory(config.run_dir)
    if chief:
        run.lock()  # before anything is written: a second kt-train stops here
    model_cfg, source_tokenizer, target_tokenizer, init = prepare_run_directory(
        config, run, strategy, corpus)
    replicas = strategy.num_replicas_in_sync
    if chief:
        for split, name in (("train", "Training"), ("valid", "Validation"), ("test", "Test")):
            if corpus.has(split):
                print(f"{name} data: {corpus.describe(split)}.", flush=True)
        print(f"Strategy {describe(strategy)} with {replicas} replica(s); precision "
              f"{config.precision} ({precision_reason}); {config.batch_tokens} tokens per "
              f"replica batch x {replicas} replicas x {config.accumulation_steps} accumulation "
              f"= {config.batch_tokens * replicas * config.accumulation_steps} tokens per "
              "update (upper bound, padding included).", flush=True)

    accumulation = config.accumulation_steps
    with strategy.scope():
        model = Transformer(model_cfg)
        optimizer = transformer_adam(
            model_cfg.d_model, warmup_steps=model_cfg.warmup_steps, scale=config.lr_scale,
            gradient_accumulation_steps=accumulation if accumulation > 1 else None,
            **({"use_ema": True, "ema_momentum": config.ema} if config.ema else {}))
        if accumulation > 1:
            optimizer.learning_rate = cb.PerUpdateSchedule(optimizer._learning_rate,
                                                           accumulation)
        if config.precision == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        model.compile(
            optimizer=optimizer,
            loss=LabelSmoothedCrossEntropy(model_cfg.label_smoothing, pad_id=model_cfg.pad_id),
            metrics=[MaskedAccuracy(pad_id=model_cfg.pad_id), cb.TargetTokens(model_cfg.pad_id)],
            steps_per_execution=config.steps_per_execution,
            jit_compile=config.jit_compile,
        )
        # Logged values are already global (synchronised metric variables;
        # see Transformer.compute_loss): take the first replica's. Keras's
        # default ("mean") fails under MultiWorkerMirroredStrategy.
        model.distribute_reduction_method = "first"
        state = TrainingRun(run, model, keep_checkpoints=config.keep_checkpoints,
                            strategy=strategy)
        if not state.restored and init is not None:
            restore_initial_weights(model, optimizer, init, config.keep_optimizer)
    start_step = optimizer_step(optimizer)
    if state.restored:
        lr = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
        print(f"Resumed from {state.restored} at step {start_step}; learning rate {lr!r}",
              flush=True)
    validating = has_validation(config)
    metric = config.best_metric or ("bleu" if config.bleu_sentences else "loss")
    selection = None
    if validating and (config.keep_best or config.early_stopping_patience):
        selection = state.best_checkpoints(metric, config.keep_best,
                                           config.early_stopping_patience)
    if start_step >= config.train_steps:
        print(f"Already at step {start_step} >= --train-steps {config.train_steps}; nothing "
              "to do.")
        return model
    if selection is not None and selection.should_stop():
        print(f"Nothing to do: {selection.summary()}", flush=True)
        return model

    # Data: every replica gets its own token-bucketed batch; a resumed run
    # skips the batches its checkpoint had already taken.
    length_filter = batching.LengthFilter(config.max_length)
    # One pipeline per worker feeds each of its replicas a batch per step.
    skip = state.skip_batches
    if skip and chief:
        print(f"Skipping the {skip} micro-batches already trained on, to continue the same "
              "stream of batches.", flush=True)
    target = None if target_tokenizer is source_tokenizer else target_tokenizer

    sampling = subword_sampling(config, source_tokenizer, target_tokenizer)
    if sampling is not None and chief:
        print(f"Subword sampling: each side of a training pair gets a segmentation drawn "
              f"from its {sampling.nbest} most likely ones with probability "
              f"P^{sampling.alpha}, anew each time (the candidates are computed "
              "once, as the first batch is read).", flush=True)

    def train_fn(context):
        pairs = corpus.pairs("train").shard(
            context.num_input_pipelines, context.input_pipeline_id)
        return batching.token_batches(
            pairs, source_tokenizer, config.batch_tokens, config.max_length, length_filter,
            shuffle_buffer=config.shuffle_buffer, seed=config.seed, repeat=True,
            cache_tokenized=config.cache_tokenized, fixed_shapes=config.jit_compile,
            target_tokenizer=target, skip_batches=skip, subword_sampling=sampling,
            autotune=config.input_autotune == "on")

    train_ds = batching.distributed_dataset(strategy, train_fn)
    val_ds = None
    if validating:
        val_filter = batching.LengthFilter(config.max_length)

        def val_fn(context):
            pairs = corpus.pairs("valid").shard(
                context.num_input_pipelines, context.input_pipeline_id)
            return batching.token_batches(pairs, source_tokenizer, config.batch_tokens,
                                          config.max_length, val_filter,
                                          fixed_shapes=config.jit_compile,
                                          target_tokenizer=target)

        val_ds = batching.distributed_dataset(strategy, val_fn)

    bleu = {}
    if validating and config.bleu_sentences:
        pairs = list(corpus.pairs("valid").take(config.bleu_sentences).as_numpy_iterator())
        bleu = dict(
            translator=translation_fn(model, source_tokenizer, target_tokenizer,
                                      config.bleu_search),
            bleu_sources=[s.decode("utf-8", "replace") for s, _ in pairs],
            bleu_references=[t.decode("utf-8", "replace") for _, t in pairs])
    run_callbacks = state.callbacks(
        train_steps=config.train_steps, checkpoint_every=config.checkpoint_every,
        max_minutes=config.max_minutes, log_every=config.log_every,
        length_filter=length_filter, steps_per_execution=config.steps_per_execution, **bleu)

    initial_epoch = state.initial_epoch(config.steps_per_epoch)
    epochs = initial_epoch + math.ceil((config.train_steps - start_step)
                                       / config.steps_per_epoch)
    with warnings.catch_warnings():
        # The training data repeats forever (callbacks stop the run), so it
        # cannot run out; the validation set has no known length, and Keras
        # (3.15) warns "Your input ran out of data; interrupting training" when
        # its first pass ends, which is how it learns that length. A false
        # alarm, fixed upstream in keras-team/keras#23360.
        warnings.filterwarnings("ignore", message="Your input ran out of data")
        try:
            model.fit(
                train_ds,
                validation_data=val_ds,
                steps_per_epoch=config.steps_per_epoch * accumulation,
                initial_epoch=initial_epoch,
                epochs=epochs,
                callbacks=[*run_callbacks, *callbacks],
                verbose=config.verbose if chief else 0,
                shuffle=False,  # the pipeline shuffles (shuffle_buffer)
            )
        finally:
            state.step_checkpoint.restore_signal_handlers()
    if state.interrupted:
        print(f"Training stopped by {state.interrupted} at step {optimizer_step(optimizer)}; "
              "run the same command again to resume.", flush=True)
        return model
    counts = length_filter.counts()
    print(f"Training finished at step {optimizer_step(optimizer)}; weights sha256 "
          f"{weights_digest(model)}; training pairs dropped for length: {counts['dropped']} "
          f"of {counts['kept'] + counts['dropped']} read.", flush=True)
    if chief:
        final_summary(run, corpus, selection)
    return model


def translation_fn(model, source_tokenizer, target_tokenizer, search):
    """What validation BLEU translates with, over the model being trained:
    its `Translator` (beam search with the paper's settings), or a greedy
    `list of str -> list of str`."""
    from keras_transformer.export.translator import Translator

    translator = Translator(model, source_tokenizer, target_tokenizer=(
        None if target_tokenizer is source_tokenizer else target_tokenizer))
    if search == "greedy":
        return lambda sentences: translator.sample(sentences, temperature=0.0)[0]
    return translator


def score_test_set(run, corpus, selector):
    """Translates the test data with the chosen checkpoint and returns the
    sacreBLEU scores."""
    from keras_transformer.evaluation import score_translations
    from keras_transformer.export.loading import translator_from_run_directory

    translator = translator_from_run_directory(run, selector)
    pairs = list(corpus.pairs("test").as_numpy_iterator())
    sources = [s for s, _ in pairs]
    references = [t.decode("utf-8", "replace") for _, t in pairs]
    # XLA compiles a search per length bucket (seconds each), which pays
    # back only over a test set of some size.
    hypotheses, _ = translator.translate(sources,
                                         jit_compile=len(sources) >= XLA_TEST_SET_SENTENCES)
    return score_translations(hypotheses, references)


def final_summary(run, corpus, selection):
    """Says which checkpoint to ship and why, and scores it on the test data."""
    if selection is not None and run.best_checkpoints():
        selector = "best"
        print(f"Checkpoint selection: {selection.summary()}", flush=True)
    else:
        selector = "last"
    prefix, reason = run.resolve_checkpoint(selector)
    print(f"The checkpoint to ship: {reason}. Export it with: kt-export "
          f"--run-dir {run.path} --checkpoint {selector}", flush=True)
    if corpus.has("test"):
        scores = score_test_set(run, corpus, prefix)
        print(f"Test BLEU {scores['bleu']:.2f} with {os.path.basename(prefix)} "
              f"({corpus.describe('test')}): {scores['bleu_text']}", flush=True)


def _checkpoint_run(prefix):
    """The run directory of a checkpoint prefix (`RUN/checkpoints/ckpt-N`,
    `RUN/best/ckpt-N`, `RUN/averaged/ckpt-N`)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(prefix)))


def init_source(path):
    """`init_from` PATH -> `(RunDirectory, checkpoint prefix, reason)`
    (`reason` names the prefix and why it was chosen):
    a run directory's checkpoint as kt-translate would choose it, or a
    checkpoint prefix inside a run directory."""
    import tensorflow as tf

    from keras_transformer.run_directory import RunDirectory

    run = RunDirectory(path)
    if os.path.isdir(path) and run.exists():
        prefix, reason = run.resolve_checkpoint(None)
        return run, prefix, reason
    if os.path.exists(path + ".index"):
        run = RunDirectory(_checkpoint_run(path))
        if not run.exists():
            raise ValueError(f"--init-from {path}: the checkpoint is not inside a run "
                             f"directory ({run.path} has no config.json and vocabulary).")
        tf.train.load_checkpoint(path)  # a readable checkpoint, or an error naming it
        return run, path, f"{path}: the checkpoint given"
    raise ValueError(f"--init-from {path}: neither a run directory (config.json, vocabulary, "
                     "checkpoints) nor a checkpoint prefix (PREFIX.index).")


def _differences(before, after, keys):
    """`{key: (before[key], after[key])}` for the `keys` whose values differ
    (a key missing from `before`, as in older run directories, is skipped)."""
    return {k: (before[k], after[k]) for k in keys if k in before and before[k] != after[k]}


def _same_architecture(source, config, where):
    """Raises naming every field that differs, except `FINE_TUNABLE` ones."""
    a, b = source.to_dict(), config.to_dict()
    differ = _differences(a, b, [k for k in a if k not in FINE_TUNABLE])
    if differ:
        raise ValueError(
            f"--init-from {where}: the new run's model differs from the trained one in "
            f"{differ} (trained, new); fine-tuning keeps the architecture and vocabulary "
            f"(only {', '.join(FINE_TUNABLE)} may change).")


def prepare_run_directory(config, run, strategy, corpus):
    """Returns `(model_config, source_tokenizer, target_tokenizer, init)`,
    `init` the `(prefix, reason)` to start from (None when resuming or
    without `init_from`): from the run directory when it exists; otherwise
    the chief makes the vocabulary and writes config and vocabulary, and
    other workers wait for them."""
    from keras_transformer.training.strategy import is_chief

    now = config.to_dict()  # what train_args.json records: every setting
    if run.exists():
        previous = run.load_args()
        changed = _differences(previous, now, FIXED_ON_RESUME)
        if changed:
            raise ValueError(
                f"{run.path} was created with different settings {changed} "
                "(was, now); use a new --run-dir or the original arguments."
            )
        source, target = run.load_tokenizers()
        model_cfg = run.load_config()
        wanted = model_config(config, source, target,
                              base=model_cfg if config.init_from else None)
        was = model_cfg.to_dict()
        differ = _differences(was, wanted.to_dict(), was)
        if differ:
            raise ValueError(f"{run.path} was created with model settings that differ from "
                             f"these: {differ} (was, now); use a new --run-dir or the "
                             "original settings.")
        stream = _differences(previous, now, DATA_STREAM)
        if stream and is_chief(strategy):
            print(f"Warning: {stream} (was, now) changed since the run began, so the resumed "
                  "run reads a different stream of batches than an uninterrupted run would.",
                  flush=True)
        init = None
        if config.init_from and run.latest_training_checkpoint() is None:
            # Stopped before its first checkpoint: start from the weights again.
            _, prefix, reason = init_source(config.init_from)
            init = (prefix, reason)
        return model_cfg, source, target, init
    if is_chief(strategy):
        init = init_run = None
        if config.init_from:
            init_run, prefix, reason = init_source(config.init_from)
            init = (prefix, reason)
        source, target = vocabularies(config, corpus, init_run)
        base = init_run.load_config() if init_run is not None else None
        model_cfg = model_config(config, source, target, base=base)
        if base is not None:
            _same_architecture(base, model_cfg, config.init_from)
        os.makedirs(run.path, exist_ok=True)
        run.save_args(now)
        run.save_tokenizers(source, None if target is source else target)
        run.save_config(model_cfg)  # last: `run.exists()` means complete.
        return model_cfg, source, target, init
    deadline = time.time() + config.wait_for_chief
    while not run.exists():
        if time.time() > deadline:
            raise TimeoutError(
                f"Waited {config.wait_for_chief}s for the chief to write {run.path}; is the "
                "run directory on a file system shared by all workers?")
        time.sleep(0.5)
    time.sleep(0.5)
    source, target = run.load_tokenizers()
    init = None
    if config.init_from:
        _, prefix, reason = init_source(config.init_from)
        init = (prefix, reason)
    return run.load_config(), source, target, init


def restore_initial_weights(model, optimizer, init, keep_optimizer):
    """Loads `--init-from`'s checkpoint into a new run's model (and, with
    `keep_optimizer`, optimizer)."""
    import tensorflow as tf

    prefix, reason = init
    if keep_optimizer:
        names = [name for name, _ in tf.train.list_variables(prefix)]
        if not any(name.startswith("optimizer/") for name in names):
            raise ValueError(
                f"--keep-optimizer: {prefix} holds no optimizer state ({reason}); give "
                "--init-from a training checkpoint (RUN/checkpoints/ckpt-N) or drop "
                "--keep-optimizer.")
        tf.train.Checkpoint(model=model, optimizer=optimizer).restore(
            prefix).expect_partial().assert_existing_objects_matched()
    else:
        # Restored through a model without an optimizer: a checkpoint of the
        # model also holds the optimizer it was compiled with (its step and
        # moments), which a fine-tuning run starts afresh.
        from keras_transformer.transformer import Transformer

        bare = Transformer(model.config)
        bare.build()
        tf.train.Checkpoint(model=bare).restore(
            prefix).expect_partial().assert_existing_objects_matched()
        for variable, value in zip(model.weights, bare.weights):
            variable.assign(value)
    print(f"Initialised from {reason}"
          f"{'; optimizer and step kept' if keep_optimizer else '; fresh optimizer'}.",
          flush=True)
