"""Training throughput (target tokens/s) of configs x precisions on this machine.

Synthetic batches of `--batch-tokens` target tokens (and as many source
tokens), full training steps (forward, label-smoothed loss, backward, Adam).
Precisions are measured in alternating rounds so that load from other
processes affects them alike and their ratio stays meaningful.

    python -m benchmarks training --configs small base --precisions float32 mixed_bfloat16
"""


from benchmarks import harness


def main(argv=None):
    p = harness.parser(__doc__)
    p.add_argument("--configs", nargs="+", default=["small", "base"])
    p.add_argument("--precisions", nargs="+", default=["float32", "mixed_bfloat16"])
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--length", type=int, default=32, help="tokens per sentence (both sides)")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--steps", type=int, default=5, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)

    import keras
    import numpy as np

    import keras_transformer as kt

    batch = args.batch_tokens // args.length
    rng = np.random.default_rng(0)
    src = rng.integers(4, args.vocab_size, (batch, args.length)).astype("int32")
    tgt = rng.integers(4, args.vocab_size, (batch, args.length)).astype("int32")
    tgt_in = np.concatenate([np.full((batch, 1), 2, "int32"), tgt[:, :-1]], axis=1)
    tokens = tgt.size
    models = {}
    for name in args.configs:
        for precision in args.precisions:
            keras.config.set_dtype_policy(precision)
            config = kt.get_config(name, vocab_size=args.vocab_size)
            model = kt.Transformer(config)
            model.compile(optimizer=kt.transformer_adam(config.d_model),
                          loss=kt.LabelSmoothedCrossEntropy(0.1, pad_id=0))
            for _ in range(2):  # trace and warm up
                model.train_on_batch((src, tgt_in), tgt)
            models[name, precision] = model
    keras.config.set_dtype_policy("float32")
    times = harness.time_rounds(
        {key: (lambda model=model: model.train_on_batch((src, tgt_in), tgt))
         for key, model in models.items()}, args.rounds, warmup=0, repeats=args.steps)
    rates = {key: [tokens / seconds for seconds in times[key]] for key in models}
    print(f"batch {batch} x {args.length} = {tokens} target tokens; {args.rounds} rounds "
          f"of {args.steps} steps; median (min-max) target tokens/s")
    for name in args.configs:
        base = None
        for precision in args.precisions:
            r = sorted(rates[name, precision])
            median = r[len(r) // 2]
            base = base or median
            print(f"{name:6s} {precision:15s} {median:8.0f} ({r[0]:.0f}-{r[-1]:.0f})  "
                  f"x{median / base:.2f}")

