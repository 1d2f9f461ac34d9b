"""TF Model Garden's `Seq2SeqTransformer` trained on a Multi30k-style text
directory the way `scripts/multi30k.sh` trains ours, then scored on the
test set: the quality reference trained on the same host, right before or
after our recipe.

    bash benchmarks/install_model_garden.sh      # once
    python -m benchmarks model-garden-multi30k --vocab runs/m30k/vocab.model \\
        --minutes 30

The same as the recipe: the data (`--data`, train split, the same
token-budgeted length-bucketed batches: `--batch-tokens 3072`,
`--max-length 128`, shuffle buffer 100,000, seed 1), the vocabulary (our
run's SentencePiece model, `--vocab`), the shapes (`--config small`,
dropout and label smoothing as configured), the schedule (the paper's, with
`--warmup-steps 500 --lr-scale 0.7`) and Adam, the wall-time budget (`--minutes`, training
only), the average of the last 5 weight snapshots taken 100 updates apart
(`kt-average --from last --num 5`), and the decoding: beam 4, alpha 0.6,
extra length 50, with Model Garden's own beam search, scored by the same
sacreBLEU call (cased, detokenized, 13a) and chrF.

Precision: Model Garden trains in float32. Under tf_keras's
`mixed_bfloat16` policy its `TransformerDecoderBlock` fails (`TypeError:
Input 'y' of 'AddV2' Op has type bfloat16 that does not match type float32`),
so where kt-train picks `mixed_bfloat16` the comparison is each package at
the fastest precision it trains in on the host.

Model Garden's model shifts the target right inside `call` and starts
decoding from id 0, so it is given the target sequence that ends with eos
(our `target_out`) and no bos. It is not validated during training (ours
validates every 200 updates inside its budget).

Writes `benchmarks/results/<cpu>_<date>_<commit>_model-garden-multi30k.json`
(or `--output`) and the test hypotheses beside it (`--hypotheses`).
"""

import collections
import os
import time

import numpy as np
import tensorflow as tf

from benchmarks import harness, model_garden_reference


def snapshot(variables):
    return [v.numpy().copy() for v in variables]


def average(snapshots):
    return [np.mean([s[i] for s in snapshots], axis=0) for i in range(len(snapshots[0]))]


def translate_file(model, tokenizer, sentences, batch_size):
    """Model Garden's beam search over `sentences`, in batches of similar
    length, returned in input order."""
    translate = model_garden_reference.translate_fn(model)
    ids = [list(i) for i in tokenizer.tokenize(tf.constant(sentences)).to_list()]
    ids = [seq + [tokenizer.eos_id] for seq in ids]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out = [""] * len(ids)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        width = max(len(ids[i]) for i in chunk)
        batch = np.full((len(chunk), width), tokenizer.pad_id, np.int32)
        for row, i in enumerate(chunk):
            batch[row, :len(ids[i])] = ids[i]
        decoded = translate(tf.constant(batch))
        texts = tokenizer.detokenize(decoded).numpy()
        for row, i in enumerate(chunk):
            out[i] = texts[row].decode("utf-8")
    return out


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--data", default=os.path.join("..", "shared", "data", "multi30k"),
                        help="directory with train and test files (text:DIR's layout)")
    parser.add_argument("--src-lang", default="en")
    parser.add_argument("--tgt-lang", default="de")
    parser.add_argument("--vocab", required=True,
                        help="the SentencePiece model of the run compared against")
    parser.add_argument("--config", default="small")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--batch-tokens", type=int, default=3072)
    parser.add_argument("--shuffle-buffer", type=int, default=100000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--warmup-steps", type=int, default=500)
    parser.add_argument("--lr-scale", type=float, default=0.7)
    parser.add_argument("--precision", default="float32", choices=("float32", "mixed_bfloat16"),
                        help="mixed_bfloat16 fails inside Model Garden's decoder (see above)")
    parser.add_argument("--minutes", type=float, default=30.0,
                        help="training wall time (decoding the test set not included)")
    parser.add_argument("--max-steps", type=int, default=None,
                        help="also stop after this many updates")
    parser.add_argument("--average", type=int, default=5,
                        help="snapshots averaged (taken every --snapshot-every updates)")
    parser.add_argument("--snapshot-every", type=int, default=100)
    parser.add_argument("--test-split", default="test_2016_flickr")
    parser.add_argument("--test-sentences", type=int, default=0, help="0: all")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--extra-length", type=int, default=50)
    parser.add_argument("--decode-batch", type=int, default=64)
    parser.add_argument("--output", default=None, help="result JSON path")
    parser.add_argument("--hypotheses", default=None, help="where to write the test translations")
    args = parser.parse_args(argv)
    if not model_garden_reference.available():
        parser.error("Model Garden is not installed: bash benchmarks/install_model_garden.sh")
    for name in ("minutes", "average", "snapshot_every", "batch_tokens"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")

    import tf_keras

    from keras_transformer.config import get_config
    from keras_transformer.data.batching import token_batches
    from keras_transformer.data.sources import load_pairs
    from keras_transformer.data.text_files import find_split_file
    from keras_transformer.evaluation import score_translations
    from keras_transformer.schedules import TransformerSchedule
    from keras_transformer.tokenizer import SubwordTokenizer

    fields = harness.record()
    precision = args.precision
    # Seed before creating the tokenizer: seeding destroys eager resources.
    tf_keras.utils.set_random_seed(args.seed)
    tokenizer = SubwordTokenizer.from_file(args.vocab)
    config = get_config(args.config, tokenizer.vocab_size, max_length=args.max_length,
                        pad_id=tokenizer.pad_id, bos_id=tokenizer.bos_id,
                        eos_id=tokenizer.eos_id)
    model, optimizer = model_garden_reference.build(
        config, beam_size=args.beam_size, alpha=args.alpha,
        extra_decode_length=args.extra_length, precision=precision)
    schedule = TransformerSchedule(config.d_model, warmup_steps=args.warmup_steps,
                                   scale=args.lr_scale)
    step_fn = model_garden_reference.train_step_fn(model, optimizer, config.label_smoothing,
                                                   config.pad_id)
    pairs = load_pairs(f"text:{args.data}", "train", args.src_lang, args.tgt_lang)
    batches = token_batches(pairs, tokenizer, args.batch_tokens, args.max_length,
                            shuffle_buffer=args.shuffle_buffer, seed=args.seed, repeat=True,
                            cache_tokenized=True)
    print(f"Model Garden Seq2SeqTransformer, {args.config} shapes, vocabulary "
          f"{tokenizer.vocab_size} ({args.vocab}); precision {precision}; "
          f"{args.batch_tokens} tokens per batch; {args.minutes:g} minutes.", flush=True)

    snapshots = collections.deque(maxlen=args.average)
    losses = []
    step = 0
    start = time.perf_counter()
    deadline = start + 60 * args.minutes
    for (source, target_in), target_out in batches:
        optimizer.learning_rate.assign(float(schedule(step)))
        losses.append(float(step_fn(source, target_in, target_out)))
        step += 1
        if step % args.snapshot_every == 0:
            snapshots.append(snapshot(model.trainable_variables))
            print(f"update {step}: loss {np.mean(losses[-args.snapshot_every:]):.4f}, "
                  f"{time.perf_counter() - start:.0f} s", flush=True)
        if time.perf_counter() >= deadline or (args.max_steps and step >= args.max_steps):
            break
    trained_s = time.perf_counter() - start
    if not snapshots or step % args.snapshot_every:
        snapshots.append(snapshot(model.trainable_variables))
    for variable, value in zip(model.trainable_variables, average(list(snapshots))):
        variable.assign(value)
    print(f"Trained {step} updates in {trained_s:.0f} s; averaged the last "
          f"{len(snapshots)} snapshots.", flush=True)

    # As kt-evaluate reads its --source and --reference.
    sources, references = (harness.read_text(find_split_file(args.data, args.test_split, lang))
                           for lang in (args.src_lang, args.tgt_lang))
    if args.test_sentences:
        sources, references = sources[:args.test_sentences], references[:args.test_sentences]
    decode_start = time.perf_counter()
    hypotheses = translate_file(model, tokenizer, sources, args.decode_batch)
    decode_s = time.perf_counter() - decode_start
    scores = score_translations(hypotheses, references, tokenized_bleu_lang=args.tgt_lang)
    print(scores["bleu_text"])
    print(scores["chrf_text"])
    print(scores["tokenized_bleu_text"])
    print(f"wall time: training {trained_s:.0f} s, test decoding {decode_s:.0f} s")
    if args.hypotheses:
        with open(args.hypotheses, "w", encoding="utf-8") as f:
            f.writelines(h + "\n" for h in hypotheses)
    document = {
        **fields, "kind": "model-garden-multi30k", "settings": vars(args),
        "precision": precision, "updates": step, "training_seconds": round(trained_s, 1),
        "decoding_seconds": round(decode_s, 1), "averaged_snapshots": len(snapshots),
        "test_sentences": len(sources), "loss_last_100": float(np.mean(losses[-100:])),
        "bleu": round(scores["bleu"], 2), "chrf": round(scores["chrf"], 2),
        "bleu_signature": scores["bleu_signature"], "bleu_text": scores["bleu_text"],
        "chrf_text": scores["chrf_text"],
        "tokenized_bleu": round(scores["tokenized_bleu"], 2),
        "tokenized_bleu_text": scores["tokenized_bleu_text"],
    }
    harness.write_result(document, fields, "model-garden-multi30k", path=args.output)
    return document
