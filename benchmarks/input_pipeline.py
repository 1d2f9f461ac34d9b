"""The CPU the training input pipeline takes from training, per update:
tokenize once (`--cache-tokenized`) against subword sampling
(`--subword-sampling`), in one process, alternating rounds.

    python -m benchmarks input-pipeline --data ../shared/data/multi30k \\
        --src-lang en --tgt-lang de --vocab runs/m30k/vocab.model

Both streams are built as kt-train builds them (`token_batches`, shuffle
buffer 100,000, seed 1, repeated) and first read past a warm-up; then each
round reads `--updates` batches from each, timing the process's CPU seconds
(user + system, every thread) and the wall time. The sampled stream's setup
(computing every sentence's candidates) is timed apart.
"""

import resource
import time

from benchmarks import harness


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def read(iterator, count):
    """CPU and wall seconds to take `count` batches from `iterator`."""
    cpu, wall = cpu_seconds(), time.perf_counter()
    for _ in range(count):
        next(iterator)
    return cpu_seconds() - cpu, time.perf_counter() - wall


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--data", required=True,
                        help="a directory with train.<src>[.gz] and train.<tgt>[.gz] (as "
                             "kt-train's --data text:DIR)")
    parser.add_argument("--src-lang", required=True)
    parser.add_argument("--tgt-lang", required=True)
    parser.add_argument("--vocab", required=True, help="a unigram SentencePiece model")
    parser.add_argument("--batch-tokens", type=int, default=3072)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--alpha", type=float, default=0.2, help="--subword-sampling")
    parser.add_argument("--nbest", type=int, default=64, help="--subword-nbest")
    parser.add_argument("--warmup", type=int, default=300, help="batches read before timing")
    parser.add_argument("--updates", type=int, default=400, help="batches per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", help="the result file (default: benchmarks/results/"
                                       "<cpu>_<date>_<commit>_input-pipeline.json)")
    args = parser.parse_args(argv)
    harness.at_least(parser, args, ["batch_tokens", "max_length", "warmup", "updates", "rounds"])

    from keras_transformer.data import batching
    from keras_transformer.data.subword_sampling import SubwordSampling
    from keras_transformer.data.text_files import text_directory_source
    from keras_transformer.tokenizer import SubwordTokenizer

    record = harness.record()
    pairs = text_directory_source(args.data, "train", args.src_lang, args.tgt_lang)
    tokenizer = SubwordTokenizer.from_file(args.vocab)
    settings = {"tokenize once": dict(cache_tokenized=True),
                f"subword sampling alpha {args.alpha}, {args.nbest}-best":
                    dict(subword_sampling=SubwordSampling(args.alpha, args.nbest))}
    report = {**record, "data": args.data, "vocab": args.vocab,
              "batch_tokens": args.batch_tokens, "warmup": args.warmup,
              "updates_per_round": args.updates, "setup": {}, "rounds": []}
    streams = {}
    for name, options in settings.items():
        cpu, wall = cpu_seconds(), time.perf_counter()
        stream = iter(batching.token_batches(
            pairs, tokenizer, args.batch_tokens, args.max_length, shuffle_buffer=100_000,
            seed=1, repeat=True, **options))
        next(stream)
        report["setup"][name] = {"cpu_s": round(cpu_seconds() - cpu, 1),
                                 "wall_s": round(time.perf_counter() - wall, 1)}
        read(stream, args.warmup)
        streams[name] = stream
        print(f"{name}: first batch after {report['setup'][name]['wall_s']} s", flush=True)
    for index in range(args.rounds):
        row = {}
        for name, stream in streams.items():
            cpu, wall = read(stream, args.updates)
            row[name] = {"cpu_ms_per_update": round(1000 * cpu / args.updates, 1),
                         "wall_ms_per_update": round(1000 * wall / args.updates, 1)}
            print(f"round {index + 1} {name}: {row[name]['cpu_ms_per_update']} ms of CPU "
                  f"per update", flush=True)
        report["rounds"].append(row)
    harness.write_result(report, record, "input-pipeline", args.json)
    return report
