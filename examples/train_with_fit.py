"""Train a translation model from your own script with `model.fit`.

The library road end to end, public names only: text pairs (a TSV file, or
two aligned files such as Multi30k's train.en/train.de) -> a shared subword
vocabulary -> token-bucketed `tf.data` pipelines -> `model.fit` with the
package's callbacks (checkpoints that resume exactly after a kill,
validation BLEU, the best checkpoints, early stopping) -> translations -> a
SavedModel for TF Serving -> reloaded.

    python examples/train_with_fit.py --train train.tsv --valid dev.tsv
    python examples/train_with_fit.py --train train.en train.de --valid val.en val.de \
        --config small --vocab-size 8000 --steps 20000      # Multi30k: docs/data.md

Run it again with the same --run-dir to resume where it stopped.
"""

import argparse
import math
import os

import keras

import keras_transformer as kt


def main(argv=None):
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    p.add_argument("--train", nargs="+", required=True, help="a TSV file, or source and target")
    p.add_argument("--valid", nargs="+", required=True, help="the same, for validation")
    p.add_argument("--run-dir", default="runs/fit")
    p.add_argument("--export-dir", default="saved_models/fit")
    p.add_argument("--config", default="tiny", help="a preset: tiny, small, base, big")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--steps", type=int, default=2000, help="optimizer updates in all")
    p.add_argument("--steps-per-epoch", type=int, default=500, help="updates per validation")
    p.add_argument("--checkpoint-every", type=int, default=500)
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    train_data = args.train[0] if len(args.train) == 1 else tuple(args.train)
    valid_data = args.valid[0] if len(args.valid) == 1 else tuple(args.valid)

    keras.utils.set_random_seed(args.seed)  # first: seeding resets TensorFlow's resources
    vocabulary = os.path.join(args.run_dir, "vocab.model")  # written by TrainingRun
    if os.path.exists(vocabulary):
        tok = kt.SubwordTokenizer.load(vocabulary)
    else:
        pairs = kt.data.read_pairs(train_data)
        tok = kt.SubwordTokenizer.train([side for pair in pairs for side in pair],
                                        vocab_size=args.vocab_size)

    config = kt.get_config(args.config, tokenizer=tok)  # vocabulary size and special ids
    model = kt.Transformer(config)
    model.compile(
        optimizer=kt.transformer_adam(config.d_model, warmup_steps=config.warmup_steps),
        loss=kt.LabelSmoothedCrossEntropy(config.label_smoothing, pad_id=config.pad_id),
        metrics=[kt.MaskedAccuracy(pad_id=config.pad_id)])
    run = kt.TrainingRun(args.run_dir, model, tokenizer=tok)  # resumes a killed run
    print(f"Starting at step {run.step} ({run.restored or 'a new run'})")

    train = kt.data.translation_dataset(
        train_data, tok, batch_tokens=args.batch_tokens, shuffle_buffer=10_000,
        seed=args.seed, repeat=True, skip_batches=run.skip_batches)
    valid = kt.data.translation_dataset(valid_data, tok, batch_tokens=args.batch_tokens)
    held_out = kt.data.read_pairs(valid_data, limit=100)
    translator = kt.Translator(model, tok)
    model.fit(
        train, validation_data=valid, steps_per_epoch=args.steps_per_epoch,
        initial_epoch=run.initial_epoch(args.steps_per_epoch),
        epochs=math.ceil(args.steps / args.steps_per_epoch),
        callbacks=run.callbacks(
            train_steps=args.steps, checkpoint_every=args.checkpoint_every,
            translator=translator, bleu_sources=[s for s, _ in held_out],
            bleu_references=[t for _, t in held_out], keep_best=3, patience=4),
        verbose=2)
    if run.interrupted:  # SIGTERM or Ctrl-C: a checkpoint at the step reached
        print(f"Stopped by {run.interrupted} at step {run.step}; run again to resume.")
        return
    print(f"Trained to step {run.step}; weights sha256 {kt.weights_digest(model)}")

    sources = [s for s, _ in held_out[:3]]
    translations, scores = translator.translate(sources)
    path = kt.export_saved_model(translator, args.export_dir)
    reloaded, _ = kt.load_saved_model(path).translate(sources)
    for source, translation, again in zip(sources, translations, reloaded):
        print(f"{source}\n  -> {translation}\n  -> {again} (the SavedModel)")
    print(f"SavedModel: {path}")


if __name__ == "__main__":
    main()
