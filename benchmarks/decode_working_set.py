"""What a decoding step's matmuls cost against how many bytes of weights
they read: the step's products, in the shapes of a config's decoder and tied
output projection, run in one XLA loop of `--steps` steps, for growing parts
of the step.

    python -m benchmarks working-set              # bench config, 4 rows
    python -m benchmarks working-set --rows 128   # the bench batch (32 x beam 4)
    python -m benchmarks working-set --dtype bfloat16   # weights stored in bfloat16
    python -m benchmarks working-set --column-blocks 2  # + the step in 2 column blocks

One sentence at beam 4 multiplies 4 rows a step (a latency request), so each
product reads its whole weight for a little arithmetic, and a step reads all
the decoder's weights and the table (~19 MB in float32 for the bench
configuration). Each part is its own compiled loop with its own weights:
the first decoder layer, the first two, ..., all of them, the output
projection alone, and the whole step (all layers and the projection), and
the whole step once more with one row (XLA:CPU emits a one-row product as
its own matrix-vector kernel, not a call into Eigen), and with
`--column-blocks N` once more with each weight stored as N column blocks
(row blocks of the table), as `kt-export --xla-column-blocks N` stores
them, each product taken block by block. The parts alternate in
rounds, in one process, so drift in the machine's speed reaches all alike.
Per part: the median time per loop, per product, the weights' bytes
read per second and the products' float operations per second. A round
times each part's `--repeats` loops and takes their mean (`harness.py`'s
`time_rounds`). `penalty` compares the whole step with its parts: its time
over the sum of the layers' (each layer taken as the first one's) and the
projection's. Near 1 the parts cost the same together; well above 1, the
step's weights no longer stay in the caches between steps.

A layer's products keep the step's dependencies: W^Q, W^K and W^V of
self-attention from one input, then W^O; the cross-attention's W^Q and W^O
(its keys and values are computed once per search); the feed-forward
layer's two. The projection is `(E x^T)^T`, as `TokenEmbedding.logits`
computes it outside training. Attention itself and the cache are left out:
only the products' weights are timed.
"""


import numpy as np
import tensorflow as tf

from benchmarks import harness
from benchmarks.bench_config import make_config
from benchmarks.harness import time_rounds
from keras_transformer.export import column_blocks


def layer_shapes(config):
    """One decoder layer's weight shapes, `(in, out)`, in the order the step
    multiplies by them: self-attention Q, K, V, O; cross-attention Q, O;
    the feed-forward layer's inner and outer."""
    d, f = config.d_model, config.d_ff
    return [(d, d)] * 6 + [(d, f), (f, d)]


class StepPart:
    """`layers` decoder layers, then the tied projection if `projection`,
    as one compiled loop of `steps` steps on `rows` rows of float32."""

    def __init__(self, config, layers, projection, rows, steps, seed, dtype="float32",
                 blocks=1):
        rng = np.random.default_rng(seed)
        self.dtype = tf.as_dtype(dtype)

        def weight(rows_in, cols, axis=1):
            # `blocks` > 1: stored as column blocks (row blocks of the
            # table), as `Translator(xla_column_blocks=blocks)` stores them.
            scaled = (rng.standard_normal((rows_in, cols)) / np.sqrt(rows_in)).astype("float32")
            return [tf.Variable(tf.cast(part, self.dtype))
                    for part in column_blocks.split(scaled, blocks, axis)]

        self.layers = [[weight(*s) for s in layer_shapes(config)] for _ in range(layers)]
        self.table = weight(config.vocab_size, config.d_model, axis=0) if projection else None
        weights = [w for ws in self.layers for w in ws] + ([self.table] if projection else [])
        self.products = len(weights)
        self.parameters = sum(int(np.prod(part.shape)) for w in weights for part in w)
        self.bytes = self.dtype.size * self.parameters
        self.rows, self.steps = rows, steps
        self.x = tf.constant(rng.standard_normal((rows, config.d_model)).astype("float32"))
        self.run = tf.function(self._loop, jit_compile=True)

    def _step(self, x):
        # tanh keeps the values bounded over the loop; each product's input
        # is the previous one's output, so XLA can neither drop nor reorder
        # them. The elementwise work is small beside the products.
        h = x

        def mm(a, w):  # a float32 product of float32 activations and stored weights
            a = tf.cast(a, self.dtype)
            return tf.cast(tf.concat([a @ part for part in w], axis=1), tf.float32)

        for wq, wk, wv, wo, cq, co, w1, w2 in self.layers:
            h = tf.tanh(mm(tf.tanh(mm(h, wq) + mm(h, wk) + mm(h, wv)), wo))
            h = tf.tanh(mm(tf.tanh(mm(h, cq)), co))
            h = tf.tanh(mm(tf.nn.relu(mm(h, w1)), w2))
        if self.table is not None:
            logits = tf.cast(tf.transpose(tf.concat(
                [tf.matmul(part, tf.cast(h, self.dtype), transpose_b=True)
                 for part in self.table], axis=0)), tf.float32)
            h = tf.tanh(logits[:, : h.shape[1]])
        return x + 1e-3 * h

    def _loop(self, x):
        return tf.while_loop(lambda i, x: i < self.steps,
                             lambda i, x: (i + 1, self._step(x)), (0, x))[1]


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--config", default="bench", help="'bench' or a preset name")
    parser.add_argument("--rows", type=int, default=4,
                        help="rows per product (sentences x beam; 4: one sentence at beam 4)")
    parser.add_argument("--steps", type=int, default=34,
                        help="steps per loop (34: a 24-token source, extra length 10)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="the weights' storage type; activations are cast to it for each "
                             "product and the products return float32")
    parser.add_argument("--column-blocks", type=int, default=1, metavar="N",
                        help="N > 1 adds a part: the whole step with each weight stored as N "
                             "column blocks and multiplied block by block, as kt-export "
                             "--xla-column-blocks N (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=8, help="loops per part per round")
    args = parser.parse_args(argv)
    harness.at_least(parser, args, ["rows", "steps", "rounds", "repeats", "column_blocks"])

    config = make_config(args.config)
    n = config.num_layers
    parts = {}
    for k in range(1, n + 1):
        parts[f"layers 1-{k}" if k > 1 else "layer 1"] = (k, False, args.rows)
    parts["projection"] = (0, True, args.rows)
    parts["whole step"] = (n, True, args.rows)
    if args.rows != 1:
        parts["whole step, 1 row"] = (n, True, 1)
    blocked = f"whole, {args.column_blocks} blocks"
    if args.column_blocks > 1:
        parts[blocked] = (n, True, args.rows)
    parts = {name: StepPart(config, *spec, steps=args.steps, seed=i, dtype=args.dtype,
                            blocks=args.column_blocks if name == blocked else 1)
             for i, (name, spec) in enumerate(parts.items())}
    times = time_rounds({name: (lambda part=part: part.run(part.x).numpy())
                         for name, part in parts.items()},
                        rounds=args.rounds, warmup=1, repeats=args.repeats)

    print(f"{args.config}: {args.dtype} weights, {args.rows} rows, {args.steps} steps a loop, "
          f"median of {args.rounds} rounds of {args.repeats} loops")
    print(f"{'part':18} {'weights MB':>10} {'ms/loop':>8} {'us/product':>10} {'GB/s':>6} "
          f"{'GFLOP/s':>7}  rounds (ms)")
    median = {}
    for name, part in parts.items():
        median[name] = float(np.median(times[name]))
        per_product = median[name] / args.steps / part.products
        rate = part.bytes * args.steps / median[name]
        flops = 2 * part.rows * part.parameters * args.steps / median[name]
        print(f"{name:18} {part.bytes / 1e6:10.2f} {median[name] * 1e3:8.2f} "
              f"{per_product * 1e6:10.1f} {rate / 1e9:6.1f} {flops / 1e9:7.1f}  "
              + " ".join(f"{t * 1e3:.1f}" for t in times[name]))
    parts_sum = n * median["layer 1"] + median["projection"]
    print(f"penalty {median['whole step'] / parts_sum:.2f} "
          f"(whole step {median['whole step'] * 1e3:.2f} ms over {n} x layer 1 "
          f"+ projection {parts_sum * 1e3:.2f} ms)")

