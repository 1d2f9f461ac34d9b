"""Average K checkpoints of a run into run_dir/averaged/: the last K training
checkpoints (paper 6.1: 5 for base, 20 for big) or, with --from best, the
best K by the validation metric from run_dir/best/. Evaluation and export then
use the average (--checkpoint auto) until training goes on past it. The run
directory is locked while averaging: not while kt-train trains in it."""

import argparse
import os
import sys

from keras_transformer import startup


def build_parser():
    p = argparse.ArgumentParser(allow_abbrev=False, prog="kt-average", description=__doc__,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--run-dir", required=True, help="a run directory written by kt-train")
    p.add_argument("--num", type=int, default=5, help="how many checkpoints to average")
    p.add_argument("--from", dest="source", choices=("last", "best"), default="last",
                   help="last: the newest --num training checkpoints (checkpoints/); best: "
                        "the best --num by the validation metric (best/, kept by kt-train "
                        "--keep-best)")
    p.add_argument("--checkpoints", nargs="*", default=None,
                   help="explicit checkpoint prefixes instead of choosing --num")
    p.add_argument("--allow-fewer", action="store_true",
                   help="average all kept checkpoints when there are fewer than --num "
                        "(default: an error)")
    startup.add_arguments(p)
    return p


def main(argv=None):
    startup.start(argv)
    args = build_parser().parse_args(argv)
    from keras_transformer.run_directory import RunDirectory
    from keras_transformer.training.checkpoints import average_checkpoints

    if args.checkpoints is not None and args.source == "best":
        print("error: --checkpoints names the checkpoints; it cannot be combined with "
              "--from best.", file=sys.stderr)
        return 2
    run = RunDirectory(args.run_dir)
    try:
        if os.path.isdir(run.path):  # a missing one is said below, not created
            run.lock("averaging")  # not while kt-train writes and deletes checkpoints
        output, inputs = average_checkpoints(run, args.num, args.checkpoints,
                                             allow_fewer=args.allow_fewer, source=args.source)
        _, reason = run.resolve_checkpoint(output)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"Averaged {len(inputs)} checkpoints ({', '.join(os.path.basename(p) for p in inputs)}) "
          f"into {output}")
    print(f"  {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
