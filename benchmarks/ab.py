"""This checkout's package against the package at another commit, in one
process, in alternating rounds: training step and beam search at the bench
shapes, and whether the two compute the same numbers.

The other commit's `keras_transformer/` is extracted with `git archive` and
imported under another name (`kt_baseline`), so both run side by side on
the same machine in the same minutes. Use it to show that a change moved
no number, or what it gained.

    python -m benchmarks ab --baseline d38c77d
    python -m benchmarks ab --baseline HEAD~1 --what train --precision mixed_bfloat16
"""

import importlib.util
import os
import sys
import tempfile

import keras
import numpy as np
import tensorflow as tf

import keras_transformer
from benchmarks import harness
from benchmarks.bench_config import TRANSLATE_SHAPE, compiled_model, make_config, random_ids
from benchmarks.harness import time_rounds
from benchmarks.speed import train_batch

BASELINE_NAME = "kt_baseline"


def import_baseline(revision, directory):
    """The package at `revision` of this repository, imported as
    `kt_baseline` from a copy under `directory` in which every
    `keras_transformer` (imports and Keras registration names) reads
    `kt_baseline`."""
    source = harness.extract_package(revision, directory)
    target = os.path.join(directory, BASELINE_NAME)
    os.rename(source, target)
    for folder, _, files in os.walk(target):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path) as f:
                    text = f.read()
                with open(path, "w") as f:
                    f.write(text.replace("keras_transformer", BASELINE_NAME))
    spec = importlib.util.spec_from_file_location(
        BASELINE_NAME, os.path.join(target, "__init__.py"), submodule_search_locations=[target])
    module = importlib.util.module_from_spec(spec)
    sys.modules[BASELINE_NAME] = module
    spec.loader.exec_module(module)
    return module


class Side:
    """One package's bench model, its training step and its beam search."""

    def __init__(self, kt, config, precision, seed):
        keras.utils.set_random_seed(seed)
        # Weights are made at the first call: here, right after the seed, so
        # that both sides start from the same ones.
        self.model = compiled_model(kt.TransformerConfig(**config.to_dict()), precision, kt,
                                    build=True)
        search = importlib.import_module(f"{kt.__name__}.decoding").beam_search_translate
        shape = TRANSLATE_SHAPE

        @tf.function(jit_compile=True)
        def translate(source):
            return search(self.model, source, beam_size=shape["beam_size"], alpha=shape["alpha"],
                          extra_length=shape["extra_length"])[0]

        self.translate = translate

    def weights(self):
        return [w.numpy() for w in self.model.weights]


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--baseline", required=True, help="a git revision of this repository")
    parser.add_argument("--config", default="bench")
    parser.add_argument("--precision", default="float32", choices=harness.PRECISIONS)
    parser.add_argument("--what", default="train,translate",
                        help="comma-separated subset of train,translate")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--train-steps", type=int, default=5, help="timed steps per round")
    parser.add_argument("--translate-repeats", type=int, default=2)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    what = harness.parts(parser, args.what, ["train", "translate"])
    config = make_config(args.config)
    with tempfile.TemporaryDirectory() as directory:
        baseline = import_baseline(args.baseline, directory)
        sides = {"baseline": Side(baseline, config, args.precision, seed=0),
                 "this": Side(keras_transformer, config, args.precision, seed=0)}
        report = {**harness.record(), "baseline": args.baseline,
                  "matmul_kernels": harness.matmul_kernels(), "config": args.config,
                  "precision": args.precision,
                  "same_initial_weights": _same(sides["baseline"].weights(),
                                                sides["this"].weights())}
        if "train" in what:
            batch = train_batch(config)
            losses = {name: [] for name in sides}
            steps = {name: (lambda side=side, name=name: losses[name].append(
                float(side.model.train_on_batch(*batch)))) for name, side in sides.items()}
            times = time_rounds(steps, args.rounds, warmup=2, repeats=args.train_steps)
            report["train"] = _compare(times)
            report["train"]["same_losses"] = losses["baseline"] == losses["this"]
            report["train"]["same_weights_after"] = _same(sides["baseline"].weights(),
                                                          sides["this"].weights())
        if "translate" in what:
            shape = TRANSLATE_SHAPE
            source = tf.constant(random_ids(config, shape["batch"], shape["source_length"], 2))
            outputs = {}
            calls = {name: (lambda side=side, name=name: outputs.__setitem__(
                name, np.asarray(side.translate(source)))) for name, side in sides.items()}
            times = time_rounds(calls, args.rounds, warmup=1, repeats=args.translate_repeats)
            report["translate"] = _compare(times)
            report["translate"]["same_translations"] = bool(
                np.array_equal(outputs["baseline"], outputs["this"]))
    print(f"same initial weights {report['same_initial_weights']}")
    for key in ("train", "translate"):
        if key in report:
            r = report[key]
            print(f"{key}: this / baseline speed {r['speed_ratio']['median']:.3f}x "
                  f"({min(r['speed_ratio']['rounds']):.3f}-{max(r['speed_ratio']['rounds']):.3f})"
                  f"; " + ", ".join(f"{k} {v}" for k, v in r.items() if k.startswith("same")))
    harness.write_json(report, args.json)
    return report


def _same(arrays, others):
    return len(arrays) == len(others) > 0 and all(
        np.array_equal(a, b) for a, b in zip(arrays, others))


def _compare(times):
    return {"s_per_call": times, "speed_ratio": harness.ratios(times["baseline"],
                                                               times["this"])}
