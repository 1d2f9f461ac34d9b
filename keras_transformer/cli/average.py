"""Average the last K checkpoints of a run into run_dir/averaged/ (paper 6.1:
5 for base, 20 for big). Evaluation and export then use the average."""

import argparse
import os
import sys

from keras_transformer import startup


def build_parser():
    p = argparse.ArgumentParser(prog="kt-average", description=__doc__,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--run-dir", required=True, help="a run directory written by kt-train")
    p.add_argument("--num", type=int, default=5, help="how many of the newest checkpoints")
    p.add_argument("--checkpoints", nargs="*", default=None,
                   help="explicit checkpoint prefixes instead of the newest --num")
    p.add_argument("--allow-fewer", action="store_true",
                   help="average all kept checkpoints when there are fewer than --num "
                        "(default: an error)")
    startup.add_arguments(p)
    return p


def main(argv=None):
    startup.start(argv)
    args = build_parser().parse_args(argv)
    from keras_transformer.training.checkpoints import average_checkpoints

    try:
        output, inputs = average_checkpoints(args.run_dir, args.num, args.checkpoints,
                                             allow_fewer=args.allow_fewer)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"Averaged {len(inputs)} checkpoints ({', '.join(os.path.basename(p) for p in inputs)}) "
          f"into {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
