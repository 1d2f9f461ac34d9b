"""The demo's training length and checkpoint averaging, chosen on the
built-in corpus's validation split over seeds: for each seed, one training
run with kt-demo's settings to `--train-steps` with a checkpoint every
`--every` updates, then every averaging choice for every end point from
`--first-end` on, scored on the validation split (the choice) and the test
split (the report).

    python -m benchmarks demo-settings --seeds 1 2 3
    python -m benchmarks demo-settings --seeds 1 --config tiny --train-steps 40 \\
        --first-end 30 --every 10 --sentences 20          # a smoke run

The learning-rate schedule does not depend on the total number of updates,
so a run passes through the weights of every shorter one: seed 1's "1,400,
last 5, 100 apart" is the demo itself (`kt-demo --seed 1` at `aeb3983`:
92.02 on the test split), and its 1,200 the demo before that. Float32, as
kt-demo trains. Writes
`benchmarks/results/<cpu>_<date>_<commit>_demo-settings.json` (or
`--output`); a seed's run directory is kept under `--work-dir` and reused.
"""

import os

from benchmarks import harness


def choices(end, every):
    """Averaging choices ending at update `end`: name -> checkpoint steps."""
    return {
        "the last alone": [end],
        f"last 3, {2 * every} apart": [end - 4 * every, end - 2 * every, end],
        f"last 3, {every} apart": [end - 2 * every, end - every, end],
        f"last 5, {every} apart": [end - 4 * every + i * every for i in range(5)],
    }


def train_seed(run_dir, seed, args):
    """kt-demo's kt-train call (`demo.training_arguments`) with a checkpoint
    every `args.every` updates, all of them kept."""
    from keras_transformer.cli import demo, train

    if os.path.exists(os.path.join(run_dir, "checkpoints", f"ckpt-{args.train_steps}.index")):
        return
    demo_args = demo.build_parser().parse_args([
        "--run-dir", run_dir, "--seed", str(seed), "--config", args.config,
        "--train-steps", str(args.train_steps)])
    status = train.main(demo.training_arguments(
        demo_args, keep_checkpoints=args.train_steps // args.every + 1,
        checkpoint_every=args.every, warmup_steps=args.warmup_steps, verbose=2))
    if status:
        raise SystemExit(f"training seed {seed} failed with status {status}")


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--config", default="demo")
    parser.add_argument("--train-steps", type=int, default=1400)
    parser.add_argument("--warmup-steps", type=int, default=400,
                        help="kt-demo's: min(400, its --train-steps // 3)")
    parser.add_argument("--every", type=int, default=100, help="updates between checkpoints")
    parser.add_argument("--first-end", type=int, default=1200,
                        help="the first end point scored (then every --every up to --train-steps)")
    parser.add_argument("--sentences", type=int, default=500,
                        help="validation and test sentences (kt-demo scores 500)")
    parser.add_argument("--work-dir", default=os.path.join("runs", "demo-settings"))
    parser.add_argument("--output", default=None)
    parser.add_argument("--no-xla", dest="xla", action="store_false",
                        help="translate without XLA (kt-demo translates under XLA; the "
                        "translations are the same, and a tiny run starts sooner)")
    args = parser.parse_args(argv)
    if args.every < 1 or args.first_end - 4 * args.every < args.every:
        parser.error("--first-end must leave room for 5 checkpoints --every apart before it")
    if args.first_end > args.train_steps:
        parser.error("--first-end must be at most --train-steps")

    from keras_transformer import startup

    startup.start([])
    from keras_transformer.data.synthetic import builtin_source
    from keras_transformer.evaluation import score_translations
    from keras_transformer.export.translator import Translator
    from keras_transformer.run_directory import RunDirectory
    from keras_transformer.training.checkpoints import average_checkpoints

    fields = harness.record()
    splits = {}
    for split in ("validation", "test"):
        pairs = list(builtin_source("", split, "en", "synth").take(args.sentences)
                     .as_numpy_iterator())
        splits[split] = ([s.decode() for s, _ in pairs], [t.decode() for _, t in pairs])
    results = {}
    for seed in args.seeds:
        run_dir = os.path.join(args.work_dir, f"seed{seed}")
        train_seed(run_dir, seed, args)
        run = RunDirectory(run_dir)
        tokenizer = run.load_tokenizer()
        for end in range(args.first_end, args.train_steps + 1, args.every):
            for name, steps in choices(end, args.every).items():
                prefixes = [f"ckpt-{step}" for step in steps]
                averaged, _ = average_checkpoints(run, len(prefixes), checkpoints=prefixes)
                translator = Translator(run.load_model(averaged), tokenizer)
                key = f"{end}, {name}"
                row = results.setdefault(key, {"end": end, "checkpoints": steps})
                for split, (sources, references) in splits.items():
                    hypotheses, _ = translator.translate(sources, jit_compile=args.xla)
                    row.setdefault(split, {})[str(seed)] = round(
                        score_translations(hypotheses, references)["bleu"], 2)
                print(f"seed {seed}, update {key}: validation {row['validation'][str(seed)]}, "
                      f"test {row['test'][str(seed)]}", flush=True)
    print(f"\n{'update, averaged':34} {'validation (worst)':>20} {'test (worst)':>14}")
    for key, row in results.items():
        print(f"{key:34} {min(row['validation'].values()):20.2f} "
              f"{min(row['test'].values()):14.2f}")
    document = {**fields, "kind": "demo-settings", "settings": vars(args), "results": results}
    harness.write_result(document, fields, "demo-settings", path=args.output)
    return document
