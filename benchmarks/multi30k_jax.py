"""Multi30k en->de validation experiments on an accelerator with
KERAS_BACKEND=jax and no TensorFlow: the 2-hour recipe's model and schedule
(`scripts/multi30k.sh` with its 2-hour flags), a setting changed per run, the
recipe's selection (validation loss over the whole validation split every 100
updates, the 5 lowest averaged, 10 validations without a new lowest stop it)
and beam 4 / alpha 1.0 over val and test_2016_flickr. For choosing settings
quickly, on validation; the recipe itself runs on the CPU.

Two steps, because the accelerator host has neither TensorFlow nor the data:

    # here (SentencePiece and the Multi30k files): the corpus as piece ids
    python -m benchmarks multi30k-jax prepare --data ../shared/data/multi30k \\
        --vocab runs/m30k/vocab.model --output runs/m30k-ids.npz
    # there: one run per setting (several may share the device)
    KERAS_BACKEND=jax python -m benchmarks multi30k-jax train --ids runs/m30k-ids.npz \\
        --name rdrop1 --r-drop 1 --updates 8000 --output-dir $OUT
    # here: detokenize and score what it decoded
    python -m benchmarks multi30k-jax score --vocab runs/m30k/vocab.model \\
        --data ../shared/data/multi30k $OUT

Differences from the CPU recipe, which make its figures comparable with each
other, not with the CPU runs': batches are bucketed to lengths 16, 24, 32,
48, 64 and 128 (the CPU pipeline's buckets are 1.1x apart), so a 4,096-token
batch holds more padding and fewer real tokens; float32 (TF32 matmuls on
NVIDIA GPUs); a numpy shuffle stream.
"""

import json
import os
import sys
import time

import numpy as np

from benchmarks import harness

PAD, BOS, EOS = 0, 2, 3
BOUNDS = (16, 24, 32, 48, 64, 128)
SPLITS = ("train", "val", "test_2016_flickr")


def prepare(args):
    """Writes the splits' piece ids (`<split>.<lang>.ids` int16 and
    `.offsets`) to one `.npz`."""
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=args.vocab)
    arrays = {}
    for split in SPLITS:
        for lang in ("en", "de"):
            with open(os.path.join(args.data, f"{split}.{lang}"), encoding="utf-8") as f:
                ids = processor.encode(f.read().split("\n")[:-1])
            arrays[f"{split}.{lang}.ids"] = np.concatenate(
                [np.asarray(i, np.int16) for i in ids])
            arrays[f"{split}.{lang}.offsets"] = np.cumsum([0] + [len(i) for i in ids])
    np.savez_compressed(args.output, vocab_size=processor.get_piece_size(), **arrays)
    print(f"{args.output}: {processor.get_piece_size()} pieces, "
          f"{len(arrays['train.en.offsets']) - 1} training pairs")


def load_ids(path, limit=0):
    """`{split: (sources, targets)}`, lists of int32 arrays, from `prepare`'s
    file; `limit` keeps that many val and test sentences (0: all)."""
    data = np.load(path)

    def sentences(split, lang):
        ids = data[f"{split}.{lang}.ids"].astype(np.int32)
        offsets = data[f"{split}.{lang}.offsets"]
        return [ids[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]

    splits = {s: (sentences(s, "en"), sentences(s, "de")) for s in SPLITS}
    if limit:
        splits = {s: (v[0][:limit], v[1][:limit]) if s != "train" else v
                  for s, v in splits.items()}
    return splits, int(data["vocab_size"])


def bucket(length):
    return next((b for b in BOUNDS if b >= length), None)


def make_batch(sources, targets, indices, width):
    """`((source, target input), target output)` int32 `(rows, width)`:
    tokens + eos, bos + tokens, tokens + eos, padded."""
    source = np.full((len(indices), width), PAD, np.int32)
    target_in, target_out = source.copy(), source.copy()
    for row, i in enumerate(indices):
        x, y = sources[i], targets[i]
        source[row, :len(x) + 1] = np.append(x, EOS)
        target_in[row, :len(y) + 1] = np.insert(y, 0, BOS)
        target_out[row, :len(y) + 1] = np.append(y, EOS)
    return (source, target_in), target_out


def training_batches(sources, targets, batch_tokens, seed):
    """An endless stream of token-bucketed batches: a bucket's pairs are
    batched once they fill `batch_tokens` positions (rows x bucket length; the
    last row may pass it), the pairs reshuffled every epoch; pairs longer
    than the last bucket are dropped."""
    rng = np.random.default_rng(seed)
    while True:
        pending = {b: [] for b in BOUNDS}
        for i in rng.permutation(len(sources)):
            width = bucket(max(len(sources[i]), len(targets[i])) + 1)
            if width is None:
                continue
            pending[width].append(i)
            if len(pending[width]) * width >= batch_tokens:
                yield make_batch(sources, targets, pending[width], width)
                pending[width] = []


def evaluation_batches(sources, targets, batch_tokens=4096):
    """Every pair once, sorted by length, in batches of at most
    `batch_tokens` positions."""
    order = sorted(range(len(sources)), key=lambda i: max(len(sources[i]), len(targets[i])))
    batches, current = [], []
    for i in order:
        width = bucket(max(len(sources[i]), len(targets[i])) + 1) or BOUNDS[-1]
        if current and (len(current) + 1) * width > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    batches.append(current)
    return [make_batch(sources, targets, b, bucket(max(
        max(len(sources[i]), len(targets[i])) for i in b) + 1) or BOUNDS[-1]) for b in batches]


def train(args):
    import jax
    import jax.numpy as jnp
    import keras

    import keras_transformer as kt
    from keras_transformer.decoding import beam_search_translate
    from keras_transformer.ops.label_smoothing import label_smoothed_cross_entropy

    if keras.backend.backend() != "jax":
        raise SystemExit("set KERAS_BACKEND=jax before Python starts")
    os.makedirs(args.output_dir, exist_ok=True)
    data, vocab_size = load_ids(args.ids, args.limit)
    keras.utils.set_random_seed(args.seed)
    config = kt.get_config(
        "small", vocab_size=vocab_size, d_model=args.d_model, d_ff=args.d_ff,
        num_layers=args.layers, dropout=args.dropout, attention_dropout=args.attention_dropout,
        activation_dropout=args.activation_dropout, r_drop=args.r_drop,
        warmup_steps=args.warmup_steps, max_length=256, pad_id=PAD, bos_id=BOS, eos_id=EOS)
    model = kt.Transformer(config)
    model.compile(optimizer=kt.transformer_adam(config.d_model, warmup_steps=args.warmup_steps,
                                                scale=args.lr_scale),
                  loss=kt.LabelSmoothedCrossEntropy(config.label_smoothing, pad_id=PAD))
    stream = training_batches(*data["train"], args.batch_tokens, args.seed)
    model.train_on_batch(*next(stream))  # builds and compiles the step
    groups = (model.trainable_variables, model.non_trainable_variables,
              model.optimizer.variables, model.metrics_variables)
    state = tuple([v.value for v in group] for group in groups)
    weights = model.trainable_variables + model.non_trainable_variables

    @jax.jit
    def loss_sums(values, source, target_in, target_out):
        with keras.StatelessScope(state_mapping=list(zip(weights, values))):
            logits = model((source, target_in), training=False)
        per_token = label_smoothed_cross_entropy(target_out, logits, config.label_smoothing, PAD)
        real = (target_out != PAD).astype(jnp.float32)
        return jnp.sum(per_token * real), jnp.sum(real)

    validation = evaluation_batches(*data["val"])

    def validation_loss(values):
        sums = [loss_sums(values, s, ti, to) for (s, ti), to in validation]
        return float(sum(s for s, _ in sums) / sum(c for _, c in sums))

    @jax.jit
    def best_hypotheses(values, source, lengths):
        with keras.StatelessScope(state_mapping=list(zip(weights, values))):
            sequences, _ = beam_search_translate(model, source, beam_size=4, alpha=1.0,
                                                 extra_length=50, source_length=lengths)
        return sequences[:, 0]

    def decode(values, split, rows=256):
        sources = data[split][0]
        order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
        out = [None] * len(sources)
        for start in range(0, len(order), rows):
            chunk = order[start:start + rows]
            longest = max(len(sources[i]) for i in chunk)
            width = 32 if longest < 32 else 64 if longest < 64 else 128
            source = np.full((rows, width), PAD, np.int32)
            lengths = np.ones((rows,), np.int32)
            for row, i in enumerate(chunk):
                source[row, :len(sources[i]) + 1] = np.append(sources[i], EOS)
                lengths[row] = len(sources[i]) + 1
            best = np.asarray(best_hypotheses(values, source, lengths))
            for row, i in enumerate(chunk):
                tokens = list(best[row])
                out[i] = tokens[:tokens.index(EOS)] if EOS in tokens else tokens
        return out

    report = {"kind": "multi30k-jax", "command": " ".join(sys.argv), "settings": vars(args),
              "device": jax.devices()[0].device_kind, "history": [], "decoded": {}}
    kept, lowest, since, step, start = [], float("inf"), 0, 1, time.time()

    def ship(tag):
        """Averages the 5 lowest-loss snapshots and decodes val and test."""
        chosen = sorted(kept, key=lambda e: e[0])[:5]
        values = [jnp.asarray(np.mean([s[j] for _, _, s in chosen], axis=0).astype(
            chosen[0][2][j].dtype)) for j in range(len(chosen[0][2]))]
        for split in ("val", "test_2016_flickr"):
            np.save(os.path.join(args.output_dir, f"{args.name}_{tag}_{split}.npy"),
                    np.array(decode(values, split), dtype=object), allow_pickle=True)
        report["decoded"][tag] = {"steps": sorted(e[1] for e in chosen),
                                  "validation_loss_of_average": validation_loss(values)}

    while step < args.updates:
        if args.deadline and time.time() - start > args.deadline and step % 100 == 0:
            report["stopped_at_deadline"] = step
            break
        logs, state = model.train_function(state, iter([jax.device_put((*next(stream), None))]))
        step += 1
        if step % 100:
            continue
        values = state[0] + state[1]
        loss = validation_loss(values)
        report["history"].append({"step": step, "validation_loss": loss,
                                  "train_loss": float(logs["loss"]),
                                  "seconds": round(time.time() - start, 1)})
        print(args.name, step, round(loss, 4), round(time.time() - start), flush=True)
        kept = sorted(kept + [(loss, step, [np.asarray(v) for v in values])],
                      key=lambda e: e[0])[:5]
        lowest, since = (loss, 0) if loss < lowest else (lowest, since + 1)
        if since >= args.patience:
            report["stopped_early_at"] = step
            break
    report["final_step"] = step
    ship("best5")
    with open(os.path.join(args.output_dir, f"{args.name}.json"), "w") as f:
        json.dump(report, f, indent=1)


def score(args):
    """sacreBLEU and the papers' tokenized BLEU of every decoded file in the
    directory, written to `scores.json` there."""
    import glob

    import sentencepiece

    from keras_transformer.evaluation import score_translations

    processor = sentencepiece.SentencePieceProcessor(model_file=args.vocab)
    scores = {}
    for path in sorted(glob.glob(os.path.join(args.directory, "*.npy"))):
        name = os.path.basename(path)[:-4]
        split = "test_2016_flickr" if name.endswith("test_2016_flickr") else "val"
        with open(os.path.join(args.data, f"{split}.de"), encoding="utf-8") as f:
            references = f.read().split("\n")[:-1]
        hypotheses = [processor.decode([int(t) for t in row])
                      for row in np.load(path, allow_pickle=True)]
        s = score_translations(hypotheses, references[:len(hypotheses)],
                               tokenized_bleu_lang="de")
        scores[name] = {"bleu": round(s["bleu"], 2), "chrf": round(s["chrf"], 2),
                        "tokenized_bleu": round(s["tokenized_bleu"], 2),
                        "bleu_text": s["bleu_text"]}
        print(f"{name}: sacreBLEU {s['bleu']:.2f}, papers' metric {s['tokenized_bleu']:.2f}, "
              f"chrF {s['chrf']:.2f}")
    with open(os.path.join(args.directory, "scores.json"), "w") as f:
        json.dump(scores, f, indent=1)


def build_parser():
    parser = harness.parser(__doc__, prog="python -m benchmarks multi30k-jax")
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prepare", help="the corpus as piece ids (SentencePiece, no TensorFlow)")
    p.add_argument("--data", required=True)
    p.add_argument("--vocab", required=True)
    p.add_argument("--output", required=True)
    t = sub.add_parser("train", help="one run on the JAX backend")
    t.add_argument("--ids", required=True)
    t.add_argument("--name", required=True)
    t.add_argument("--output-dir", default=os.environ.get("OUT", "."))
    t.add_argument("--updates", type=int, default=16000)
    t.add_argument("--deadline", type=float, default=0, help="seconds of training at most")
    t.add_argument("--patience", type=int, default=10)
    t.add_argument("--r-drop", type=float, default=0.0)
    t.add_argument("--dropout", type=float, default=0.3)
    t.add_argument("--attention-dropout", type=float, default=0.0)
    t.add_argument("--activation-dropout", type=float, default=0.0)
    t.add_argument("--batch-tokens", type=int, default=4096)
    t.add_argument("--warmup-steps", type=int, default=2000)
    t.add_argument("--lr-scale", type=float, default=2.53)
    t.add_argument("--d-model", type=int, default=128)
    t.add_argument("--d-ff", type=int, default=256)
    t.add_argument("--layers", type=int, default=4)
    t.add_argument("--seed", type=int, default=1)
    t.add_argument("--limit", type=int, default=0, help="val and test sentences (0: all)")
    s = sub.add_parser("score", help="score a directory of decoded ids")
    s.add_argument("directory")
    s.add_argument("--vocab", required=True)
    s.add_argument("--data", required=True)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    {"prepare": prepare, "train": train, "score": score}[args.step](args)
