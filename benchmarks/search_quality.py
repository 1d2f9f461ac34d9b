"""Beam search against exhaustive search, on small scripted models: how
often each search misses the best finished hypothesis.

    python -m benchmarks search-quality [--models 200] [--seed 0] [--baseline REV]

A model is a fixed random table of next-token log-probabilities, one row
per prefix (`scripted_models`): `VOCAB` tokens, the last of them eos, and a
length limit `LIMIT` (eos included), so every sequence the searches can
return is enumerated (`exhaustive_best`). Both searches run with
`BEAM_SIZE` and `ALPHA` on the same models: this package's `beam_search`
and TF Model Garden's `sequence_beam_search` (optional, benchmark-only:
`bash benchmarks/install_model_garden.sh`). A search *misses* a model when
its best returned hypothesis scores below the exhaustive best finished one
(GNMT penalty, float64), or does not end in eos. Writes
`benchmarks/results/<cpu>_<date>_<commit>_search-quality.json` (`--json`
names another file); `--baseline REV` adds the package's search as it was at
a git revision. tests/test_beam_search.py runs the package's side on
the same models.
"""

import os
import time

import numpy as np

from benchmarks import harness

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

VOCAB = 7
EOS = VOCAB - 1
LIMIT = 6
BEAM_SIZE = 4
ALPHA = 0.6
MODELS = 200
SEED = 0
# Logits are `SCALE * N(0, 1)`, as in the tests' random scripted tables
# (tests/support/scripted.py).
SCALE = 2.0


def prefix_rows(vocab=VOCAB, limit=LIMIT):
    """How many prefixes a search can extend: the sequences of at most
    `limit - 1` non-eos tokens (the empty one included)."""
    return sum((vocab - 1) ** k for k in range(limit))


def child_row(row, token, vocab=VOCAB):
    """The row of prefix `row` followed by non-eos `token` (bijective base
    `vocab - 1`: the empty prefix is row 0, every prefix has its own row)."""
    return row * (vocab - 1) + token + 1


def scripted_models(count=MODELS, seed=SEED, vocab=VOCAB, limit=LIMIT, scale=SCALE):
    """`(count, prefix_rows, vocab)` float32 log-probabilities: row `r` of
    model `m` is the next-token distribution after prefix `r` (see
    `child_row`). The same `count`, `seed` and shape give the same models on
    any machine (NumPy's PCG64)."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((count, prefix_rows(vocab, limit), vocab), dtype=np.float32)
    logits *= scale
    return (logits - np.log(np.exp(logits.astype(np.float64)).sum(-1, keepdims=True))
            ).astype(np.float32)


def penalty(length, alpha=ALPHA):
    return ((5.0 + np.asarray(length, np.float64)) / 6.0) ** alpha


def exhaustive_best(tables, limit=LIMIT, alpha=ALPHA):
    """The best finished hypothesis of each model, by enumeration:
    `(scores (count,) float64, sequences list of token lists)`, over every
    sequence of at most `limit` tokens whose last (only) is eos."""
    tables = np.asarray(tables, np.float64)
    count, _, vocab = tables.shape
    eos = vocab - 1
    best = np.full(count, -np.inf)
    best_row = np.zeros(count, np.int64)
    best_length = np.zeros(count, np.int64)
    # Prefixes level by level: rows of length k are contiguous.
    rows, log_p = np.array([0]), np.zeros((count, 1))
    for k in range(limit):
        finished = (log_p + tables[:, rows, eos]) / penalty(k + 1, alpha)
        pick = finished.argmax(1)
        better = finished[np.arange(count), pick] > best
        best = np.where(better, finished[np.arange(count), pick], best)
        best_row = np.where(better, rows[pick], best_row)
        best_length = np.where(better, k + 1, best_length)
        if k + 1 < limit:
            children = child_row(rows[:, None], np.arange(vocab - 1)[None, :], vocab)
            log_p = (log_p[:, :, None] + tables[:, rows, :eos]).reshape(count, -1)
            rows = children.reshape(-1)
    return best, [row_tokens(r, n - 1, vocab) + [eos] for r, n in zip(best_row, best_length)]


def row_tokens(row, length, vocab=VOCAB):
    """The `length` non-eos tokens of prefix `row` (inverse of `child_row`)."""
    tokens = []
    for _ in range(length):
        row, token = divmod(int(row) - 1, vocab - 1)
        tokens.append(token)
    return tokens[::-1]


def hypothesis_score(table, tokens, alpha=ALPHA):
    """float64 `(score, finished)` of `tokens` under one model's `table`
    `(rows, vocab)`: up to and including the first eos (finished), or all of
    them (an eos-less hypothesis, scored without eos's cost)."""
    table = np.asarray(table, np.float64)
    eos = table.shape[1] - 1
    row, log_p, length = 0, 0.0, 0
    for token in tokens:
        if token < 0 or token >= table.shape[1]:  # padding: an empty slot
            break
        log_p += table[row, token]
        length += 1
        if token == eos:
            return log_p / penalty(length, alpha), True
        row = child_row(row, token, table.shape[1])
    return log_p / penalty(length, alpha), False


class TableStep:
    """`symbols_to_logits_fn` over `tables` for both searches: the cache
    holds each row's model and prefix row; `ids` is the last token, `(rows,)`
    (this package) or the whole sequence so far, `(rows, step + 1)` (Model
    Garden)."""

    def __init__(self, tables):
        from keras import ops

        self.ops = ops
        self.rows, self.vocab = tables.shape[1], tables.shape[2]
        self.flat = ops.convert_to_tensor(np.reshape(tables, (-1, self.vocab)))

    def initial_cache(self, count):
        return {"model": np.arange(count, dtype=np.int32),
                "prefix": np.zeros(count, np.int32)}

    def __call__(self, ids, step, cache):
        ops = self.ops
        ids = ops.cast(ids, "int32")
        if len(ids.shape) == 2:
            ids = ids[:, -1]
        # Model Garden's cache must be float: the cache keeps its dtype.
        dtype = cache["prefix"].dtype
        model, prefix = (ops.cast(cache[k], "int32") for k in ("model", "prefix"))
        # Row 0 at step 0 (ids is the start token); the modulus keeps a
        # placeholder beam's row in range.
        prefix = ops.where(ops.equal(step, 0), 0, child_row(prefix, ids, self.vocab) % self.rows)
        logits = ops.take(self.flat, model * self.rows + prefix, axis=0)
        return logits, {"model": cache["model"], "prefix": ops.cast(prefix, dtype)}


def package_search(tables, beam_size=BEAM_SIZE, alpha=ALPHA, limit=LIMIT, beam_search=None):
    """This package's beam search (or `beam_search`, the same function from
    another revision) over every model in one batch: `(sequences (count,
    beam, limit), scores (count, beam))` NumPy."""
    if beam_search is None:
        from keras_transformer.decoding import beam_search

    step = TableStep(tables)
    count = tables.shape[0]
    sequences, scores = beam_search(step, np.zeros(count, np.int32), step.initial_cache(count),
                                    beam_size, alpha, limit, eos_id=tables.shape[2] - 1,
                                    pad_id=-1)
    return np.asarray(sequences), np.asarray(scores)


def model_garden_search(tables, beam_size=BEAM_SIZE, alpha=ALPHA, limit=LIMIT):
    """Model Garden's `sequence_beam_search` over every model in one batch:
    `(sequences (count, beam, limit), scores (count, beam))` NumPy, the
    start token dropped."""
    import tensorflow as tf
    from official.nlp.modeling.ops import beam_search as mg

    step = TableStep(tables)
    count = tables.shape[0]
    cache = {k: tf.constant(v, tf.float32) for k, v in step.initial_cache(count).items()}
    sequences, scores = mg.sequence_beam_search(
        step, tf.zeros([count], tf.int32), cache, vocab_size=tables.shape[2],
        beam_size=beam_size, alpha=alpha, max_decode_length=limit, eos_id=tables.shape[2] - 1)
    return np.asarray(sequences)[:, :, 1:], np.asarray(scores)


def misses(tables, sequences, alpha=ALPHA, limit=LIMIT):
    """How a search did against `exhaustive_best`: a dict of `missed` (its
    best returned hypothesis scores below the best finished one, beyond
    float32 rounding, or is not finished), `unfinished` (its best returned
    hypothesis has no eos), their model indices, and `returned_scores`
    (float64 rescoring of each best returned hypothesis)."""
    best, _ = exhaustive_best(tables, limit, alpha)
    missed, unfinished, returned = [], [], []
    for m, hypothesis in enumerate(sequences[:, 0]):
        score, finished = hypothesis_score(tables[m], [int(t) for t in hypothesis])
        returned.append(score)
        if not finished:
            unfinished.append(m)
        if not finished or score < best[m] - 1e-5 * abs(best[m]):
            missed.append(m)
    return {"missed": len(missed), "unfinished": len(unfinished), "missed_models": missed,
            "unfinished_models": unfinished, "returned_scores": returned}


def beam_search_at(revision):
    """`beam_search` from `keras_transformer/decoding/beam_search.py` as it
    was at git `revision`, imported beside the checkout's (its imports
    resolve to the checkout's package)."""
    import importlib.util
    import subprocess
    import tempfile

    source = subprocess.run(
        ["git", "show", f"{revision}:keras_transformer/decoding/beam_search.py"],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "beam_search_at_revision.py")
        with open(path, "w") as f:
            f.write(source)
        spec = importlib.util.spec_from_file_location("beam_search_at_revision", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module.beam_search



def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--models", type=int, default=MODELS, help="scripted models")
    parser.add_argument("--seed", type=int, default=SEED, help="the models' seed")
    parser.add_argument("--baseline", metavar="REV",
                        help="also run the package's beam search as it was at git REV")
    parser.add_argument("--json", help="the result file (default: benchmarks/results/"
                                       "<cpu>_<date>_<commit>_search-quality.json)")
    args = parser.parse_args(argv)
    harness.at_least(parser, args, ["models"])
    from benchmarks import model_garden_reference

    if not model_garden_reference.available():
        parser.error("Model Garden is not installed: bash benchmarks/install_model_garden.sh")
    searches = [("keras_transformer", package_search)]
    if args.baseline:
        baseline = beam_search_at(args.baseline)
        searches.append((f"keras_transformer@{args.baseline}",
                         lambda tables: package_search(tables, beam_search=baseline)))
    searches.append(("model_garden", model_garden_search))
    record = harness.record()
    tables = scripted_models(args.models, args.seed)
    report = {**record, "models": args.models, "seed": args.seed, "vocab": VOCAB,
              "eos_id": EOS, "limit": LIMIT, "beam_size": BEAM_SIZE, "alpha": ALPHA,
              "logit_scale": SCALE, "results": {}}
    for name, search in searches:
        started = time.perf_counter()
        sequences, _ = search(tables)
        seconds = time.perf_counter() - started
        result = misses(tables, sequences)
        result.pop("returned_scores")
        report["results"][name] = {**result, "seconds": round(seconds, 3)}
        print(f"{name:26s} missed the best finished hypothesis in {result['missed']:4d} of "
              f"{args.models}; returned an unfinished one in {result['unfinished']:4d} "
              f"({seconds:.1f} s)")
    harness.write_result(report, record, "search-quality", args.json)
    return report
